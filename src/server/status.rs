//! gRPC statuses of the session's and the ledger's errors (the table is in README, "Errors
//! and their codes").

use datafusion::common::DataFusionError;
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::policy::PolicyError;

/// The gRPC code of a ledger refusal (see the module docs).
fn policy_code(e: &PolicyError) -> tonic::Code {
    match e {
        PolicyError::BudgetExhausted { .. } => tonic::Code::PermissionDenied,
        PolicyError::NoShare { .. } => tonic::Code::PermissionDenied,
        PolicyError::Unauthenticated(_) => tonic::Code::Unauthenticated,
        PolicyError::Invalid(_) => tonic::Code::InvalidArgument,
        PolicyError::Catalog(_) | PolicyError::Storage(_) => tonic::Code::Unavailable,
    }
}

/// The gRPC status of a session error: the session's message, a code by kind, and what kind
/// of error it is in the `dpcurve-error` metadata entry (`refused` with the guard's rule in
/// `dpcurve-rule`, `invalid`, `resources-exhausted`; ledger errors as [`policy_status`]).
pub fn status_of(e: &DataFusionError) -> Status {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(p) = s.downcast_ref::<PolicyError>() {
            return policy_status(p);
        }
        source = s.source();
    }
    let message = e.to_string();
    let root = e.find_root();
    let (mut status, kind) = match root {
        DataFusionError::ResourcesExhausted(_) => (Status::resource_exhausted(message), Some("resources-exhausted")),
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => (Status::invalid_argument(message), Some("invalid")),
        _ => (Status::internal(message), None),
    };
    let rule = match root {
        DataFusionError::Plan(m) => guard_rule(m),
        _ => None,
    };
    let metadata = status.metadata_mut();
    if let Some(rule) = rule {
        metadata.insert("dpcurve-error", MetadataValue::from_static("refused"));
        // Rule names are the guard's own lower-case ASCII words.
        if let Ok(v) = MetadataValue::try_from(rule) {
            metadata.insert("dpcurve-rule", v);
        }
    } else if let Some(kind) = kind {
        metadata.insert("dpcurve-error", MetadataValue::from_static(kind));
    }
    status
}

/// The guard rule a planning error names (its messages start `[rule <name>]`).
fn guard_rule(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("[rule ")?;
    let name = &rest[..rest.find(']')?];
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')).then_some(name)
}

/// What kind of refusal a ledger error is, for programs (the `dpcurve-error` metadata entry).
fn policy_kind(e: &PolicyError) -> &'static str {
    match e {
        PolicyError::BudgetExhausted { .. } => "budget-exhausted",
        PolicyError::NoShare { .. } => "no-share",
        PolicyError::Unauthenticated(_) => "unauthenticated",
        PolicyError::Invalid(_) => "invalid",
        PolicyError::Catalog(_) | PolicyError::Storage(_) => "catalog-unavailable",
    }
}

/// The gRPC status of a ledger or catalog error: its kind in the `dpcurve-error` metadata
/// entry and, for a refusal by budget or share, the table (`dpcurve-table`), whether the
/// analyst's share or the table's total is short (`dpcurve-scope`: `share` or `table`), and
/// what the query costs and what remains (`dpcurve-cost-epsilon`, `dpcurve-cost-delta`,
/// `dpcurve-remaining-epsilon`, `dpcurve-remaining-delta`, as decimal numbers).
pub fn policy_status(e: &PolicyError) -> Status {
    let mut status = Status::new(policy_code(e), e.to_string());
    let metadata = status.metadata_mut();
    metadata.insert("dpcurve-error", MetadataValue::from_static(policy_kind(e)));
    let mut put = |key: &'static str, value: String| {
        if let Ok(v) = MetadataValue::try_from(value) {
            metadata.insert(key, v);
        }
    };
    match e {
        PolicyError::BudgetExhausted { table, analyst, cost, remaining } => {
            put("dpcurve-table", table.clone());
            put("dpcurve-scope", if analyst.is_some() { "share" } else { "table" }.into());
            put("dpcurve-cost-epsilon", cost.epsilon().to_string());
            put("dpcurve-cost-delta", cost.delta().to_string());
            put("dpcurve-remaining-epsilon", remaining.epsilon().to_string());
            put("dpcurve-remaining-delta", remaining.delta().to_string());
        }
        PolicyError::NoShare { table, .. } => put("dpcurve-table", table.clone()),
        _ => {}
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_read_only_from_the_guards_prefix() {
        assert_eq!(guard_rule("[rule no-raw-rows] private table 't' …"), Some("no-raw-rows"));
        assert_eq!(guard_rule("[rule privacy-unit] x"), Some("privacy-unit"));
        assert_eq!(guard_rule("column [rule no-raw-rows] later"), None);
        assert_eq!(guard_rule("[rule ] x"), None);
        assert_eq!(guard_rule("[rule no raw] x"), None);
        assert_eq!(guard_rule("[rule no-raw-rows"), None);
    }
}
