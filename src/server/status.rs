//! gRPC statuses of the session's and the ledger's errors (the table is in README, "Errors
//! and their codes").

use datafusion::common::DataFusionError;
use tonic::Status;

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

/// The gRPC status of a session error: the session's message, a code by kind.
pub fn status_of(e: &DataFusionError) -> Status {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(p) = s.downcast_ref::<PolicyError>() {
            return policy_status(p);
        }
        source = s.source();
    }
    let message = e.to_string();
    match e.find_root() {
        DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(message),
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => Status::invalid_argument(message),
        _ => Status::internal(message),
    }
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

/// The gRPC status of a ledger or catalog error, its kind in the `dpcurve-error` metadata entry.
pub fn policy_status(e: &PolicyError) -> Status {
    let mut status = Status::new(policy_code(e), e.to_string());
    status.metadata_mut().insert("dpcurve-error", tonic::metadata::MetadataValue::from_static(policy_kind(e)));
    status
}
