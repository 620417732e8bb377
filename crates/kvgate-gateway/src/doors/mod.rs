//! Every way in: the OpenAI API, the admin API and dashboard, the endpoint picker, the
//! peers' endpoint and NATS bus, the server that listens for them, and the keys, throttles, shedding
//! and TLS in front of them.

pub(crate) mod admin;
pub(crate) mod api;
pub(crate) mod auth;
pub(crate) mod dashboard;
pub(crate) mod epp;
pub(crate) mod peer_bus;
pub(crate) mod peer_state;
pub(crate) mod peer_wire;
pub(crate) mod peers;
pub(crate) mod server;
pub(crate) mod shed;
pub(crate) mod tenant_keys;
pub(crate) mod throttle;
pub(crate) mod tls;
