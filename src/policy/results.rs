//! Kept results of paid executions in SQL: `stored_result(execution)` re-reads, for free, the
//! whole result a server sent for one paid execution (listed in `dpcurve.results`). A result
//! is post-processing of the execution's releases and public values, so reading it again reads
//! no table and spends no budget (SPEC §0); an analyst's session reads only their own.
//!
//! ```sql
//! SELECT execution FROM dpcurve.results WHERE statement_sha256 = '…';
//! SELECT * FROM stored_result(12);
//! ```

use std::sync::Arc;

use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue, plan_err};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;

use super::catalog::Catalog;

/// The Arrow IPC stream of `batches` (what [`Catalog::store_result`] keeps).
pub fn encode(schema: &datafusion::arrow::datatypes::Schema, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut w = StreamWriter::try_new(Vec::new(), schema)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    Ok(w.into_inner()?)
}

/// `stored_result(execution)`: the kept result of one of the session's paid executions.
#[derive(Debug)]
pub struct StoredResultFunction {
    catalog: Arc<Catalog>,
    analyst: Option<String>,
}

impl StoredResultFunction {
    /// The function as `analyst`'s session sees it (None: the table owner's, which reads all).
    pub fn new(catalog: Arc<Catalog>, analyst: Option<String>) -> Self {
        Self { catalog, analyst }
    }
}

impl TableFunctionImpl for StoredResultFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let execution = match args.exprs() {
            [Expr::Literal(ScalarValue::Int64(Some(n)), _)] => *n,
            _ => return plan_err!("stored_result(execution) takes one integer literal, such as stored_result(12)"),
        };
        let data = self
            .catalog
            .stored_result_of(execution, self.analyst.as_deref())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let Some(data) = data else {
            // Unknown, not kept, or another analyst's: the same answer, the caller's mistake.
            return plan_err!(
                "stored_result: there is no kept result of execution {execution} (dpcurve.results lists the \
                 executions whose results were kept; their releases are in dpcurve.releases)"
            );
        };
        let reader = StreamReader::try_new(std::io::Cursor::new(data), None)?;
        let schema = reader.schema();
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
    }
}
