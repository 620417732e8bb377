//! Per-rank and per-replica event endpoints: one port rule, shared by the
//! gateway (which subscribes to a data-parallel server's ranks), the
//! simulator (which publishes them) and `kvgate sim --replicas`.

/// vLLM's rule (`offset_endpoint_port` in `distributed/kv_events.py`): the
/// TCP port of `endpoint` plus `offset`. An offset of 0, or a port of 0 (the
/// OS picks one), leaves the endpoint as it is. An endpoint without a port
/// (`ipc://`, `inproc://`) cannot be offset; neither can a port pushed past
/// 65535.
pub fn offset_endpoint_port(endpoint: &str, offset: u32) -> Result<String, String> {
    if offset == 0 {
        return Ok(endpoint.to_owned());
    }
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return Err(format!("endpoint {endpoint:?} has no port to offset"));
    };
    let port: u32 =
        port.parse().map_err(|_| format!("endpoint {endpoint:?} has no port to offset"))?;
    if port == 0 {
        return Ok(endpoint.to_owned());
    }
    match u16::try_from(port + offset) {
        Ok(p) => Ok(format!("{host}:{p}")),
        Err(_) => Err(format!("endpoint {endpoint:?} plus {offset} is past port 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::offset_endpoint_port as offset;

    #[test]
    fn ports_move_by_the_offset_and_zero_stays() {
        assert_eq!(offset("tcp://*:5557", 2).as_deref(), Ok("tcp://*:5559"));
        assert_eq!(offset("tcp://[::1]:10", 1).as_deref(), Ok("tcp://[::1]:11"));
        assert_eq!(offset("tcp://*:0", 2).as_deref(), Ok("tcp://*:0"));
        assert_eq!(offset("ipc:///tmp/x", 0).as_deref(), Ok("ipc:///tmp/x"));
        assert!(offset("ipc:///tmp/x", 1).is_err());
        assert!(offset("tcp://h:65535", 1).unwrap_err().contains("65535"));
    }
}
