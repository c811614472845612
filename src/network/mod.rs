//! The network layer: the proxy that is a sandbox's one way out (its
//! decisions are `policy::network`'s; Linux's namespace setup is
//! `linux::net`).

pub mod asks;
pub mod proxy;
