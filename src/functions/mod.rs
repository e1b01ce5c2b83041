//! DataFusion glue: the private aggregate UDFs, their literal parameters, and the
//! rewrite that lets optional arguments be named in any combination.

pub mod aggregate;
pub mod arrays;
pub mod call;
pub mod group_rows;
pub mod groups;
pub mod kernel_fit;
pub mod named_args;
pub mod params;
pub mod permits;
pub mod post;
pub mod private_cdf;
pub mod private_kde;
pub mod private_kde2d;
pub mod private_kernel_classifier;
pub mod private_kernel_regression;
pub mod private_mean_curve;
pub mod registry;
pub mod release;
mod release_threads;
pub mod releases;

pub use call::{CallContext, PolicyArgs, PrivateCall};
pub use permits::{PermitSlot, Permits, ReleaseStore, SlotCharge};
pub use private_kde::PrivateKde;
pub use private_kde2d::PrivateKde2d;
pub use private_kernel_classifier::PrivateKernelClassifier;
pub use private_kernel_regression::PrivateKernelRegression;
pub use private_mean_curve::PrivateMeanCurve;
pub use registry::{
    all_params, context_of, is_private, params_of, permits_of, plan_private_call, policy_args_of, private_udafs,
    with_context, with_parameters, with_permits,
};
