//! A loopback Ballista cluster of `dpcurve scheduler` and `dpcurve executor` processes, for
//! the cluster tests and the cluster bench (`#[path]`-included there).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::TempDir;

/// A free TCP port on 127.0.0.1 for a child process to listen on.
///
/// Not an ephemeral port (`bind(0)`): those come from the range the kernel also gives every
/// outgoing connection, and an executor's own connection to the scheduler took one that a
/// parallel test had just been handed as "free" (CI failure, 2026-11-23). These come from
/// below that range (Linux: 32768–60999), each at most once per test process, and are checked
/// free. Another process may still take one before the child binds: [`Cluster`] retries.
pub fn free_port() -> u16 {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let port = (LOW + (base + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Waits until something listens on every port of `ports`; false (and `child` killed) if
/// `child` exited first or 15 s passed (a Ballista executor whose Flight port was taken logs
/// an error and runs on without it).
fn listening(child: &mut Child, ports: &[u16]) -> bool {
    let start = Instant::now();
    while ports.iter().any(|&p| std::net::TcpStream::connect(("127.0.0.1", p)).is_err()) {
        if child.try_wait().unwrap().is_some() || start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Starts a child listening on `n` (1 or 2) fresh ports, retrying when one was taken in between.
fn spawn_listening(what: &str, n: usize, mut spawn: impl FnMut(u16, u16) -> Child) -> (Child, u16) {
    for _ in 0..5 {
        let ports = [free_port(), free_port()];
        let mut child = spawn(ports[0], ports[1]);
        if listening(&mut child, &ports[..n]) {
            return (child, ports[0]);
        }
    }
    panic!("{what} did not start listening after 5 tries");
}

/// A loopback cluster: one scheduler and `executors` executors, killed when dropped.
pub struct Cluster {
    pub scheduler: Child,
    pub executors: Vec<Child>,
    pub port: u16,
    _work: TempDir,
}

impl Cluster {
    /// `executors` executors of 2 task slots each.
    pub fn start(executors: usize) -> Cluster {
        Self::start_with(executors, 2)
    }

    /// `executors` executors of `tasks` task slots each.
    pub fn start_with(executors: usize, tasks: usize) -> Cluster {
        let work = TempDir::new("cluster-work");
        let bin = env!("CARGO_BIN_EXE_dpcurve");
        let (scheduler, port) = spawn_listening("the scheduler", 1, |port, _| {
            Command::new(bin)
                .args(["scheduler", "--listen", &format!("127.0.0.1:{port}"), "--executor-timeout", "5"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        });
        let mut cluster = Cluster { scheduler, executors: Vec::new(), port, _work: work };
        for i in 0..executors {
            let dir = cluster._work.path(&format!("executor-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let (child, _) = spawn_listening("an executor", 2, |flight, grpc| {
                Command::new(bin)
                    .args(["executor", "--scheduler", &format!("127.0.0.1:{port}")])
                    .args(["--port", &flight.to_string(), "--grpc-port", &grpc.to_string()])
                    .args([
                        "--concurrent-tasks",
                        &tasks.to_string(),
                        "--heartbeat",
                        "1",
                        "--work-dir",
                        &dir.to_string_lossy(),
                    ])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap()
            });
            cluster.executors.push(child);
        }
        // Registration follows the first heartbeat (1 s).
        std::thread::sleep(Duration::from_millis(1500));
        cluster
    }

    pub fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    pub fn kill_executors(&mut self) {
        for e in &mut self.executors {
            let _ = e.kill();
            let _ = e.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_executors();
        let _ = self.scheduler.kill();
        let _ = self.scheduler.wait();
    }
}
