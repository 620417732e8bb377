//! A replica's status is the fleet core's (`kvgate-fleet`).

pub(crate) use kvgate_fleet::Failure;
