//! Data owners' side: the catalog of tables and privacy policies, the durable budget
//! ledger (one SQLite file), and the table providers of catalog sessions.

pub mod analysts;
pub mod catalog;
pub mod error;
mod hex;
pub mod locations;
pub mod public_store;
pub mod query_log;
pub mod results;
mod schema;
pub mod shares;
pub mod table;
pub mod verified_files;

pub use analysts::AnalystInfo;
pub use catalog::{
    Catalog, Charge, Policy, PolicyError, PrivacyUnit, ReleaseRecord, StoredReleaseRecord, StoredResultRecord,
    TableInfo,
};
pub use query_log::QueryRecord;
pub use shares::Grant;
pub use table::{BudgetsTable, PrivateTable, ReleasesTable, ResultsTable};
pub use verified_files::VerifiedFile;
