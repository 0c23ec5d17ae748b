//! The login phase (RFC 7143 §6, §11.12-11.13, keys of §13): stages, the answer to each key, and
//! the session parameters it leaves. Pure: the connection feeds it login requests and sends
//! what it answers. docs/design/iscsi.md §3 has the table of keys.

use crate::pdu::{Bhs, Pdu, op};
use crate::text;

/// Login status classes and details (RFC 7143 §11.13.5), as `class << 8 | detail`.
pub mod status {
    /// Success.
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error: authentication failed.
    pub const AUTH_FAILED: u16 = 0x0201;
    /// Initiator error: the target named does not exist.
    pub const NOT_FOUND: u16 = 0x0203;
    /// Initiator error: no version in common.
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    /// Initiator error: a required key is missing.
    pub const MISSING_PARAMETER: u16 = 0x0207;
    /// Initiator error: the session type is not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    /// Initiator error: the session to add a connection to does not exist.
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020A;
    /// Initiator error: a request not valid during login (bad stage, malformed keys).
    pub const INVALID_DURING_LOGIN: u16 = 0x020B;
    /// Target error.
    pub const TARGET_ERROR: u16 = 0x0300;
    /// Target error: out of resources.
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// Stages (CSG/NSG).
const SECURITY: u8 = 0;
const OPERATIONAL: u8 = 1;
const FULL_FEATURE: u8 = 3;

/// What the target offers; the results of the negotiation are bounded by these.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    /// The target's MaxRecvDataSegmentLength (what the initiator may send in one PDU).
    pub max_recv_data_segment: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
}

impl Default for Offer {
    fn default() -> Offer {
        Offer { max_recv_data_segment: 256 * 1024, max_burst: 256 * 1024, first_burst: 64 * 1024 }
    }
}

/// A session's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    /// SendTargets only.
    Discovery,
    /// Commands to one target.
    Normal,
}

/// The parameters a login leaves (RFC 7143 defaults until negotiated).
#[derive(Debug, Clone)]
pub struct Params {
    /// Discovery or normal.
    pub session_type: SessionType,
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName (normal sessions).
    pub target_name: String,
    /// The session's ISID (6 bytes, right-aligned).
    pub isid: u64,
    /// The session's TSIH.
    pub tsih: u16,
    /// CRC32C header digests.
    pub header_digest: bool,
    /// CRC32C data digests.
    pub data_digest: bool,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// The initiator's MaxRecvDataSegmentLength: the most the target sends in one PDU.
    pub send_data_segment: u32,
    /// The target's MaxRecvDataSegmentLength: the most the initiator sends in one PDU.
    pub recv_data_segment: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
}

impl Params {
    fn new(offer: Offer) -> Params {
        Params {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            target_name: String::new(),
            isid: 0,
            tsih: 0,
            header_digest: false,
            data_digest: false,
            initial_r2t: true,
            immediate_data: true,
            send_data_segment: 8192,
            recv_data_segment: offer.max_recv_data_segment,
            max_burst: offer.max_burst.min(262_144),
            first_burst: offer.first_burst.min(65_536),
        }
    }
}

/// What the connection does with a login request.
#[derive(Debug)]
pub enum Step {
    /// Send this response and read the next request.
    Continue(Bhs, Vec<u8>),
    /// Send this response; the login phase is over and the full feature phase begins.
    Done(Bhs, Vec<u8>),
    /// Send this response (a failure status) and close the connection.
    Fail(Bhs),
}

/// One connection's login phase.
#[derive(Debug)]
pub struct Login {
    offer: Offer,
    params: Params,
    /// Keys received in earlier PDUs of a request continued with the C bit.
    partial: Vec<u8>,
    first: bool,
    stage: u8,
    /// The target's name was checked and TargetPortalGroupTag sent.
    target_declared: bool,
    /// Next StatSN to send; the initiator's ExpCmdSN we answer with.
    stat_sn: u32,
    exp_cmd_sn: u32,
    window: u32,
}

/// Keys that mean nothing in a discovery session (RFC 7143 §13: "Irrelevant" there).
const NORMAL_ONLY: [&str; 7] = [
    "MaxBurstLength",
    "FirstBurstLength",
    "InitialR2T",
    "ImmediateData",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
];

impl Login {
    /// A login phase with `window` commands allowed once in the full feature phase.
    pub fn new(offer: Offer, window: u32) -> Login {
        Login {
            offer,
            params: Params::new(offer),
            partial: Vec::new(),
            first: true,
            stage: SECURITY,
            target_declared: false,
            stat_sn: 0,
            exp_cmd_sn: 0,
            window,
        }
    }

    /// The parameters negotiated (final once [`Step::Done`] was returned).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The next StatSN and the ExpCmdSN the full feature phase starts with.
    pub fn sequence(&self) -> (u32, u32) {
        (self.stat_sn, self.exp_cmd_sn)
    }

    /// Answers one login request. `target_exists` says whether a TargetName is served;
    /// `new_tsih` gives the session its identifier when the login completes.
    pub fn step(
        &mut self,
        req: &Pdu,
        target_exists: impl Fn(&str) -> bool,
        new_tsih: impl FnOnce() -> u16,
    ) -> Step {
        let bhs = &req.bhs;
        if bhs.opcode() != op::LOGIN {
            return Step::Fail(self.response(bhs, 0, status::INVALID_DURING_LOGIN));
        }
        if self.first {
            self.first = false;
            self.stat_sn = bhs.u32_at(28);
            self.exp_cmd_sn = bhs.u32_at(24);
            // ISID: bytes 8-13.
            self.params.isid = bhs.u64_at(8) >> 16;
            self.params.tsih = bhs.u16_at(14);
            // Version-max (2) and version-min (3): only version 0 exists.
            if bhs.0[3] != 0 {
                return Step::Fail(self.response(bhs, 0, status::UNSUPPORTED_VERSION));
            }
            if self.params.tsih != 0 {
                // Adding a connection to an existing session (MaxConnections is 1).
                return Step::Fail(self.response(bhs, 0, status::SESSION_DOES_NOT_EXIST));
            }
        }
        let flags = bhs.flags();
        let (transit, cont) = (flags & 0x80 != 0, flags & 0x40 != 0);
        let (csg, nsg) = ((flags >> 2) & 3, flags & 3);
        // The first request may skip the security stage (no authentication asked for).
        if !self.target_declared && self.partial.is_empty() && csg == OPERATIONAL {
            self.stage = OPERATIONAL;
        }
        if csg != self.stage || csg == 2 || csg == FULL_FEATURE || (transit && cont) {
            return Step::Fail(self.response(bhs, 0, status::INVALID_DURING_LOGIN));
        }
        self.partial.extend_from_slice(&req.data);
        if self.partial.len() > text::TEXT_MAX_BYTES {
            return Step::Fail(self.response(bhs, 0, status::INVALID_DURING_LOGIN));
        }
        if cont {
            // More of this request's text follows: an empty answer asks for it.
            let mut r = self.response(bhs, 0, status::SUCCESS);
            r.0[1] = csg << 2;
            return Step::Continue(r, Vec::new());
        }
        let keys = match text::parse(&std::mem::take(&mut self.partial)) {
            Ok(keys) => keys,
            Err(_) => return Step::Fail(self.response(bhs, 0, status::INVALID_DURING_LOGIN)),
        };
        let mut answer = Vec::new();
        // SessionType first: it decides which other keys mean anything.
        let session_first = keys.iter().filter(|(k, _)| k == "SessionType");
        for (key, value) in session_first.chain(keys.iter().filter(|(k, _)| k != "SessionType")) {
            if let Err(fail) = self.negotiate(key, value, &mut answer) {
                return Step::Fail(self.response(bhs, 0, fail));
            }
        }
        // The first request names the initiator and, for a normal session, the target.
        if self.params.initiator_name.is_empty() {
            return Step::Fail(self.response(bhs, 0, status::MISSING_PARAMETER));
        }
        if !self.target_declared {
            if self.params.session_type == SessionType::Normal {
                if self.params.target_name.is_empty() {
                    return Step::Fail(self.response(bhs, 0, status::MISSING_PARAMETER));
                }
                if !target_exists(&self.params.target_name) {
                    return Step::Fail(self.response(bhs, 0, status::NOT_FOUND));
                }
                answer.push(("TargetPortalGroupTag".into(), "1".into()));
            }
            self.target_declared = true;
        }
        // Security needs nothing more: AuthMethod None is the only method.
        let next = if transit {
            match (csg, nsg) {
                (SECURITY, OPERATIONAL | FULL_FEATURE) | (OPERATIONAL, FULL_FEATURE) => nsg,
                _ => return Step::Fail(self.response(bhs, 0, status::INVALID_DURING_LOGIN)),
            }
        } else {
            csg
        };
        if next == FULL_FEATURE {
            // The target declares its own receive limit before the phase ends.
            if !answer.iter().any(|(k, _)| k == "MaxRecvDataSegmentLength") {
                answer.push(("MaxRecvDataSegmentLength".into(), self.params.recv_data_segment.to_string()));
            }
            self.params.first_burst = self.params.first_burst.min(self.params.max_burst);
            self.params.tsih = new_tsih();
        }
        let mut r = self.response(bhs, 0, status::SUCCESS);
        r.0[1] = if next != csg { 0x80 | csg << 2 | next } else { csg << 2 };
        r.set_u16(14, self.params.tsih);
        let data = text::encode(&answer);
        if next == FULL_FEATURE {
            Step::Done(r, data)
        } else {
            self.stage = next;
            Step::Continue(r, data)
        }
    }

    /// A login response to `req` with `status`, numbered (each response advances StatSN).
    fn response(&mut self, req: &Bhs, flags: u8, status: u16) -> Bhs {
        let mut r = Bhs::new(op::LOGIN_RESPONSE);
        r.0[1] = flags;
        r.0[8..14].copy_from_slice(&req.0[8..14]);
        r.set_u16(14, self.params.tsih);
        r.set_u32(16, req.itt());
        r.set_u32(24, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
        r.set_u32(28, self.exp_cmd_sn);
        r.set_u32(32, self.exp_cmd_sn.wrapping_add(self.window).wrapping_sub(1));
        r.set_u16(36, status);
        r
    }

    /// Answers one key into `answer`; a failure status ends the login.
    fn negotiate(&mut self, key: &str, value: &str, answer: &mut Vec<(String, String)>) -> Result<(), u16> {
        let discovery = self.params.session_type == SessionType::Discovery;
        let offer = self.offer;
        let p = &mut self.params;
        let mut reply = |v: &str| answer.push((key.to_string(), v.to_string()));
        match key {
            "InitiatorName" => p.initiator_name = value.to_string(),
            "InitiatorAlias" => {}
            "TargetName" => p.target_name = value.to_string(),
            "SessionType" => match value {
                "Normal" => p.session_type = SessionType::Normal,
                "Discovery" => p.session_type = SessionType::Discovery,
                _ => return Err(status::SESSION_TYPE_NOT_SUPPORTED),
            },
            "AuthMethod" => {
                if value.split(',').any(|m| m == "None") {
                    reply("None");
                } else {
                    return Err(status::AUTH_FAILED);
                }
            }
            "HeaderDigest" | "DataDigest" => {
                let chosen = value.split(',').find(|d| *d == "None" || *d == "CRC32C");
                match chosen {
                    Some(d) => {
                        let crc = d == "CRC32C";
                        if key == "HeaderDigest" {
                            p.header_digest = crc;
                        } else {
                            p.data_digest = crc;
                        }
                        reply(d);
                    }
                    None => reply("Reject"),
                }
            }
            k if discovery && NORMAL_ONLY.contains(&k) => reply("Irrelevant"),
            "MaxRecvDataSegmentLength" => match number(value, 512, (1 << 24) - 1) {
                Some(n) => {
                    p.send_data_segment = n;
                    reply(&p.recv_data_segment.to_string());
                }
                None => reply("Reject"),
            },
            "MaxBurstLength" => match number(value, 512, (1 << 24) - 1) {
                Some(n) => {
                    p.max_burst = n.min(offer.max_burst);
                    reply(&p.max_burst.to_string());
                }
                None => reply("Reject"),
            },
            "FirstBurstLength" => match number(value, 512, (1 << 24) - 1) {
                Some(n) => {
                    p.first_burst = n.min(offer.first_burst);
                    reply(&p.first_burst.to_string());
                }
                None => reply("Reject"),
            },
            "InitialR2T"
            | "ImmediateData"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "IFMarker"
            | "OFMarker" => match value {
                "Yes" | "No" => {
                    let yes = value == "Yes";
                    let result = match key {
                        // OR with the target's No: the initiator's value.
                        "InitialR2T" => {
                            p.initial_r2t = yes;
                            yes
                        }
                        // AND with the target's Yes.
                        "ImmediateData" => {
                            p.immediate_data = yes;
                            yes
                        }
                        // OR with the target's Yes: data in order always.
                        "DataPDUInOrder" | "DataSequenceInOrder" => true,
                        // AND with the target's No: no markers.
                        _ => false,
                    };
                    reply(if result { "Yes" } else { "No" });
                }
                _ => reply("Reject"),
            },
            "MaxConnections" | "MaxOutstandingR2T" => match number(value, 1, 65535) {
                Some(_) => reply("1"),
                None => reply("Reject"),
            },
            "ErrorRecoveryLevel" | "DefaultTime2Retain" => match number(value, 0, 3600) {
                Some(_) => reply("0"),
                None => reply("Reject"),
            },
            "DefaultTime2Wait" => match number(value, 0, 3600) {
                Some(n) => reply(&n.max(2).to_string()),
                None => reply("Reject"),
            },
            _ => reply("NotUnderstood"),
        }
        Ok(())
    }
}

/// A decimal (or 0x hex) number within `min..=max`.
fn number(value: &str, min: u32, max: u32) -> Option<u32> {
    let n = match value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
        None => value.parse().ok()?,
    };
    (min..=max).contains(&n).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(flags: u8, keys: &str) -> Pdu {
        let mut bhs = Bhs::new(op::LOGIN);
        bhs.0[0] |= 0x40;
        bhs.0[1] = flags;
        bhs.set_u64(8, 0x0023_4567_89AB_0000).set_u32(16, 7).set_u32(24, 100).set_u32(28, 50);
        Pdu { bhs, ahs: Vec::new(), data: keys.replace(';', "\0").into_bytes(), data_digest_ok: true }
    }

    fn keys(data: &[u8]) -> Vec<(String, String)> {
        text::parse(data).expect("text")
    }

    #[test]
    fn a_normal_login_through_both_stages_negotiates_every_key() {
        let mut login = Login::new(Offer::default(), 32);
        let exists = |t: &str| t == "iqn.t";
        let first =
            request(0x81, "InitiatorName=iqn.i;TargetName=iqn.t;SessionType=Normal;AuthMethod=CHAP,None");
        let Step::Continue(bhs, data) = login.step(&first, exists, || unreachable!()) else {
            panic!("continue")
        };
        assert_eq!((bhs.opcode(), bhs.flags(), bhs.u16_at(36)), (op::LOGIN_RESPONSE, 0x81, 0));
        assert_eq!((bhs.u32_at(24), bhs.u32_at(28), bhs.u32_at(32)), (50, 100, 131));
        assert_eq!(bhs.u64_at(8) >> 16, 0x0023_4567_89AB, "ISID echoed");
        assert_eq!(
            keys(&data),
            [("AuthMethod".into(), "None".into()), ("TargetPortalGroupTag".into(), "1".into())]
        );
        let second = request(
            0x87,
            "HeaderDigest=CRC32C,None;DataDigest=None;MaxRecvDataSegmentLength=65536;MaxBurstLength=1048576;\
             FirstBurstLength=262144;InitialR2T=No;ImmediateData=Yes;MaxOutstandingR2T=8;X-Vendor=1",
        );
        let Step::Done(bhs, data) = login.step(&second, exists, || 9) else { panic!("done") };
        assert_eq!((bhs.flags(), bhs.u16_at(14), bhs.u32_at(24)), (0x87, 9, 51));
        let got = keys(&data);
        let want = [
            ("HeaderDigest", "CRC32C"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "262144"),
            ("MaxBurstLength", "262144"),
            ("FirstBurstLength", "65536"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "1"),
            ("X-Vendor", "NotUnderstood"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k.to_string(), v.to_string())));
        let p = login.params();
        assert!(p.header_digest && !p.data_digest && !p.initial_r2t && p.immediate_data);
        assert_eq!((p.send_data_segment, p.max_burst, p.first_burst, p.tsih), (65536, 262_144, 65536, 9));
        assert_eq!(login.sequence(), (52, 100));
    }

    #[test]
    fn logins_that_cannot_succeed_fail_with_the_right_status() {
        let status_of = |req: Pdu| match Login::new(Offer::default(), 32).step(&req, |t| t == "iqn.t", || 1) {
            Step::Fail(bhs) => bhs.u16_at(36),
            other => panic!("{other:?}"),
        };
        assert_eq!(status_of(request(0x81, "InitiatorName=i;TargetName=iqn.nope")), status::NOT_FOUND);
        assert_eq!(status_of(request(0x81, "InitiatorName=i")), status::MISSING_PARAMETER);
        assert_eq!(status_of(request(0x81, "TargetName=iqn.t")), status::MISSING_PARAMETER);
        assert_eq!(
            status_of(request(0x81, "InitiatorName=i;TargetName=iqn.t;AuthMethod=CHAP")),
            status::AUTH_FAILED
        );
        assert_eq!(
            status_of(request(0x81, "InitiatorName=i;SessionType=Other")),
            status::SESSION_TYPE_NOT_SUPPORTED
        );
        assert_eq!(status_of(request(0x81, "InitiatorName=i;=x")), status::INVALID_DURING_LOGIN);
        assert_eq!(
            status_of(request(0x87 & !0x04 | 0x08, "InitiatorName=i")),
            status::INVALID_DURING_LOGIN,
            "CSG 2"
        );
        let mut old = request(0x81, "InitiatorName=i;TargetName=iqn.t");
        old.bhs.0[3] = 1;
        assert_eq!(status_of(old), status::UNSUPPORTED_VERSION);
    }

    #[test]
    fn a_discovery_session_calls_normal_keys_irrelevant_and_text_may_continue() {
        let mut login = Login::new(Offer::default(), 32);
        let part = request(0x40, "InitiatorName=i;Sess");
        let Step::Continue(bhs, data) = login.step(&part, |_| false, || 1) else { panic!("continue") };
        assert!(data.is_empty() && bhs.flags() == 0, "an empty answer asks for the rest");
        let rest = request(0x83, "ionType=Discovery;MaxBurstLength=4096");
        let Step::Done(_, data) = login.step(&rest, |_| false, || 1) else { panic!("done") };
        assert_eq!(keys(&data)[0], ("MaxBurstLength".into(), "Irrelevant".into()));
        assert_eq!(login.params().session_type, SessionType::Discovery);
    }
}
