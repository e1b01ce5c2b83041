//! Nothing an analyst observes through `dpcurve serve` besides the released numbers depends on
//! one row (SPEC §0): two servers over neighbouring catalogs (with and without alice's row, the
//! same policies and history) answer the same requests of an analyst with the same error codes,
//! messages and machine-readable details, and list the same kept results (execution, statement
//! hash, size) and releases.
#![cfg(feature = "server")]

mod common;

use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use common::Server;
use common::neighbours::{Neighbours, text_rows};
use futures::TryStreamExt;
use tonic::transport::Channel;

const KDE: &str = "private_kde(x, 0.1, 0.5, 0, 0, 1, points => 16)";

async fn client(addr: &str, token: &str) -> FlightSqlServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut c = FlightSqlServiceClient::new(channel);
    c.set_token(token.to_string());
    c
}

/// An error as the analyst sees it: its text and the `dpcurve-*` metadata of its gRPC status.
fn shown(e: &(dyn std::error::Error + 'static)) -> String {
    let mut details = Vec::new();
    let mut at = Some(e);
    while let Some(err) = at {
        let status = match err.downcast_ref::<FlightError>() {
            Some(FlightError::Tonic(s)) => Some(s.as_ref()),
            _ => err.downcast_ref::<tonic::Status>(),
        };
        if let Some(s) = status {
            for kv in s.metadata().iter() {
                if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv
                    && k.as_str().starts_with("dpcurve-")
                {
                    details.push(format!("{}={}", k.as_str(), v.to_str().unwrap()));
                }
            }
        }
        at = err.source();
    }
    details.sort();
    format!("{e} {details:?}")
}

/// The rows (as text; floats and curves left out), or the error with its details.
async fn observe(c: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<Vec<String>>, String> {
    let info = c.execute(sql.to_string(), None).await.map_err(|e| shown(&e))?;
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let stream = c.do_get(ticket).await.map_err(|e| shown(&e))?;
    let batches: Vec<_> = stream.try_collect().await.map_err(|e| shown(&e))?;
    Ok(text_rows(&batches))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_their_details_and_kept_results_do_not_depend_on_one_row() {
    let n = Neighbours::new("nb-server").await;
    let mut sides = Vec::new();
    for (dir, admin) in [&n.with, &n.without] {
        let token = admin.add_analyst("ana").unwrap();
        admin.grant("ana", "p", 2.0, 0.0).unwrap();
        let server = Server::start(&dir.path("catalog.db"), &[]);
        let c = client(&server.addr, &token).await;
        sides.push((server, c));
    }
    let queries = [
        format!("SELECT g, {KDE}['release'] AS r FROM p GROUP BY g"),
        format!("SELECT {KDE}['release'] AS r FROM p WHERE name = 'alice'"),
        // Refused by the guard (its rule in the details), a bad parameter, a table without a share.
        "SELECT x FROM p".to_string(),
        "SELECT private_kde(x, 0.1, 0.5, 0, 0, 1, points => 1) FROM p".to_string(),
        format!("SELECT {KDE} FROM q"),
        // The share (2) has 1 left: two more calls spend it, the third is refused with what remains.
        format!("SELECT g, {KDE}['release'] AS r FROM p WHERE name = 'alice' GROUP BY g"),
        format!("SELECT g, {KDE}['release'] AS r FROM p WHERE flag = 't' GROUP BY g"),
        format!("SELECT g, {KDE}['release'] AS r FROM p GROUP BY g"),
        // What is listed afterwards.
        "SELECT execution, statement_sha256, query, bytes, analyst FROM dpcurve.results ORDER BY execution".to_string(),
        "SELECT release, execution, statement_sha256, function, parameters, charge, query, analyst \
         FROM dpcurve.releases ORDER BY release"
            .to_string(),
        "SELECT table_name, share_epsilon_remaining FROM dpcurve.budgets ORDER BY table_name".to_string(),
    ];
    let mut refusals = 0;
    for q in &queries {
        let a = observe(&mut sides[0].1, q).await;
        let b = observe(&mut sides[1].1, q).await;
        assert_eq!(a, b, "{q}");
        if let Err(e) = &a {
            refusals += 1;
            // The details travel with the status.
            assert!(e.contains("dpcurve-error="), "{q}: {e}");
        }
    }
    assert_eq!(refusals, 4, "three refusals before the charge and one over the share");
}
