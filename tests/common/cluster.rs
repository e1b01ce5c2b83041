//! A loopback Ballista cluster of `dpcurve scheduler` and `dpcurve executor` processes, for
//! the cluster tests and the cluster bench (`#[path]`-included there).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::TempDir;

/// A free TCP port on 127.0.0.1 (released before use: a tiny race, fine on a test machine).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn wait_for_port(port: u16, what: &str) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "{what} did not start listening on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
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
        let port = free_port();
        let bin = env!("CARGO_BIN_EXE_dpcurve");
        let scheduler = Command::new(bin)
            .args(["scheduler", "--listen", &format!("127.0.0.1:{port}"), "--executor-timeout", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(port, "the scheduler");
        let mut cluster = Cluster { scheduler, executors: Vec::new(), port, _work: work };
        for i in 0..executors {
            let (flight, grpc) = (free_port(), free_port());
            let dir = cluster._work.path(&format!("executor-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let child = Command::new(bin)
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
                .unwrap();
            wait_for_port(flight, "an executor");
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
