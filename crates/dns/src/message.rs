//! From a request message to a reply: answered from the index, or marked for relay upstream.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::DNSClass;

use crate::records::{Answer, Records};

/// Largest UDP reply we send to clients that advertise more through EDNS (the DNS flag day size).
const MAX_UDP_PAYLOAD: u16 = 1232;

/// What to do with one request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Send these bytes back.
    Reply(Vec<u8>),
    /// Relay the request as it is to the upstreams.
    Forward,
    /// Unparseable without an ID, or not a question: drop it.
    Drop,
}

/// Decides the reply to a raw request. `synced` says the index holds a full list of both kinds;
/// `udp` caps the reply at the client's advertised size.
pub(crate) fn decide(records: &Records, synced: bool, raw: &[u8], udp: bool) -> Decision {
    let request = match Message::from_vec(raw) {
        Ok(m) => m,
        // Never answer what claims to be a response: two servers could bounce errors forever.
        Err(_) if raw.len() >= 3 && raw[2] & 0x80 == 0 => {
            let id = u16::from_be_bytes([raw[0], raw[1]]);
            return encode(Message::error_msg(id, OpCode::Query, ResponseCode::FormErr), usize::MAX);
        }
        Err(_) => return Decision::Drop,
    };
    if request.metadata.message_type != MessageType::Query {
        return Decision::Drop;
    }
    if request.metadata.op_code != OpCode::Query {
        return encode(error_reply(&request, ResponseCode::NotImp), usize::MAX);
    }
    let [query] = request.queries.as_slice() else {
        return encode(error_reply(&request, ResponseCode::FormErr), usize::MAX);
    };
    if query.query_class() != DNSClass::IN {
        return Decision::Forward;
    }
    // Before the first full list an in-zone answer could be a false NXDOMAIN that clients cache;
    // SERVFAIL makes them retry instead.
    if !synced && records.zone().zone_of(&query.name().to_lowercase()) {
        return encode(error_reply(&request, ResponseCode::ServFail), usize::MAX);
    }
    let answer = records.answer(query.name(), query.query_type());
    let mut reply = reply_to(&request);
    reply.metadata.authoritative = true;
    match answer {
        Answer::NotInZone => return Decision::Forward,
        Answer::Records { answers, additionals } => {
            reply.answers = answers;
            reply.additionals = additionals;
        }
        Answer::NoData { soa } => reply.authorities = vec![soa],
        Answer::NxDomain { soa } => {
            reply.metadata.response_code = ResponseCode::NXDomain;
            reply.authorities = vec![soa];
        }
    }
    let limit = if udp { usize::from(request.max_payload().min(MAX_UDP_PAYLOAD)) } else { usize::MAX };
    encode(reply, limit)
}

/// SERVFAIL for a request we could not relay; `None` when the request does not parse.
pub(crate) fn servfail(raw: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(raw).ok()?;
    error_reply(&request, ResponseCode::ServFail).to_vec().ok()
}

fn reply_to(request: &Message) -> Message {
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.metadata.checking_disabled = request.metadata.checking_disabled;
    reply.queries = request.queries.clone();
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        reply.edns = Some(edns);
    }
    reply
}

fn error_reply(request: &Message, code: ResponseCode) -> Message {
    let mut reply = reply_to(request);
    reply.metadata.response_code = code;
    reply
}

/// Encodes `reply`; over `limit` bytes it goes out empty with TC set so the client asks over TCP.
fn encode(reply: Message, limit: usize) -> Decision {
    match reply.to_vec() {
        Ok(bytes) if bytes.len() <= limit => Decision::Reply(bytes),
        Ok(_) => match reply.truncate().to_vec() {
            Ok(bytes) => Decision::Reply(bytes),
            Err(_) => Decision::Drop,
        },
        Err(e) => {
            tracing::warn!(error = %e, "encoding a dns reply failed");
            Decision::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::{Message, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::json;

    use super::{Decision, decide};
    use crate::records::Records;

    fn query(name: &str, qtype: RecordType) -> Vec<u8> {
        let mut msg = Message::query();
        msg.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        msg.to_vec().unwrap()
    }

    fn reply(decision: Decision) -> Message {
        match decision {
            Decision::Reply(bytes) => Message::from_vec(&bytes).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    /// A headless service with enough endpoints that its A answer outgrows 512 bytes.
    fn big_headless() -> Records {
        let mut r = Records::new("cluster.local").unwrap();
        r.apply_service(
            &serde_json::from_value(
                json!({"metadata": {"namespace": "ns", "name": "big"}, "spec": {"clusterIP": "None"}}),
            )
            .unwrap(),
        );
        let endpoints: Vec<_> = (1..=60).map(|i| json!({"addresses": [format!("10.1.0.{i}")]})).collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "big-1", "labels": {"kubernetes.io/service-name": "big"}},
            "addressType": "IPv4",
            "endpoints": endpoints
        }))
        .unwrap();
        r.apply_slice(&slice);
        r
    }

    #[test]
    fn an_answer_too_big_for_udp_goes_out_empty_with_tc_set() {
        let r = big_headless();
        let raw = query("big.ns.svc.cluster.local.", RecordType::A);
        let over_udp = reply(decide(&r, true, &raw, true));
        assert!(over_udp.metadata.truncation);
        assert!(over_udp.answers.is_empty());
        let over_tcp = reply(decide(&r, true, &raw, false));
        assert!(!over_tcp.metadata.truncation);
        assert_eq!(over_tcp.answers.len(), 60);
    }

    #[test]
    fn in_zone_questions_before_the_first_list_get_servfail_and_others_are_relayed() {
        let r = Records::new("cluster.local").unwrap();
        let early = reply(decide(&r, false, &query("web.default.svc.cluster.local.", RecordType::A), true));
        assert_eq!(early.metadata.response_code, ResponseCode::ServFail);
        assert!(matches!(decide(&r, false, &query("example.com.", RecordType::A), true), Decision::Forward));
    }

    #[test]
    fn a_nxdomain_reply_is_authoritative_and_echoes_the_question() {
        let r = Records::new("cluster.local").unwrap();
        let raw = query("nope.default.svc.cluster.local.", RecordType::A);
        let msg = reply(decide(&r, true, &raw, true));
        assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain);
        assert!(msg.metadata.authoritative);
        assert_eq!(msg.queries[0].name().to_ascii(), "nope.default.svc.cluster.local.");
        assert_eq!(msg.metadata.id, Message::from_vec(&raw).unwrap().metadata.id);
    }

    #[test]
    fn garbage_with_an_id_gets_formerr_and_shorter_or_response_garbage_is_dropped() {
        let r = Records::new("cluster.local").unwrap();
        let msg = reply(decide(&r, true, &[0x12, 0x34, 0x01], true));
        assert_eq!(msg.metadata.id, 0x1234);
        assert_eq!(msg.metadata.response_code, ResponseCode::FormErr);
        assert!(matches!(decide(&r, true, &[0x12], true), Decision::Drop));
        assert!(matches!(decide(&r, true, &[0x12, 0x34, 0x81], true), Decision::Drop));
    }

    #[test]
    fn an_operation_other_than_query_is_not_implemented() {
        let r = Records::new("cluster.local").unwrap();
        let mut msg = Message::query();
        msg.metadata.op_code = OpCode::Status;
        msg.add_query(Query::query(Name::from_ascii("web.default.svc.cluster.local.").unwrap(), RecordType::A));
        let answer = reply(decide(&r, true, &msg.to_vec().unwrap(), true));
        assert_eq!(answer.metadata.response_code, ResponseCode::NotImp);
    }
}
