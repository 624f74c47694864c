//! From a decoded change event to jobs: the device registry ([`registry`]), which effect
//! goes to which device ([`router`]), and each effect rendered as its device's job
//! ([`render`]).

pub mod registry;
pub mod render;
pub mod router;
