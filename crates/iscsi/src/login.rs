//! The login phase (RFC 7143 §6, §11.12-11.13, keys of §13): stages, the answer to each key, and
//! the session parameters it leaves. Pure: the connection feeds it login requests and sends
//! what it answers. docs/design/iscsi.md §3 has the table of keys.

use std::sync::Arc;

use md5::{Digest, Md5};

use crate::pdu::{Bhs, Pdu, op};
use crate::text;

/// CHAP credentials the target requires of every login (RFC 7143 §12.1.3 over RFC 1994, MD5).
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// The name initiators give (CHAP_N).
    pub user: String,
    /// The secret they prove they know (at least 12 bytes).
    pub secret: Vec<u8>,
    /// Mutual CHAP: the name and secret the target proves to an initiator that asks.
    pub mutual: Option<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mutual = self.mutual.as_ref().map(|(user, _)| user);
        f.debug_struct("Chap").field("user", &self.user).field("mutual_user", &mutual).finish_non_exhaustive()
    }
}

/// Shortest secret accepted (RFC 7143 §12.1.3: at least 96 bits).
pub const CHAP_SECRET_MIN_BYTES: usize = 12;

/// Where CHAP stands in a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// Not asked for yet.
    Start,
    /// AuthMethod=CHAP agreed; CHAP_A expected.
    Method,
    /// A challenge sent; CHAP_N and CHAP_R expected.
    Challenged { id: u8, challenge: [u8; 16] },
    /// The initiator proved its secret (and the target its own, when asked).
    Done,
}

/// The CHAP keys of one request.
#[derive(Debug, Default)]
struct ChapKeys {
    name: Option<String>,
    response: Option<String>,
    id: Option<String>,
    challenge: Option<String>,
}

/// MD5 over the identifier, the secret and the challenge (RFC 1994's response).
fn chap_response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// `0x`-prefixed hex as bytes (CHAP values; base64 is not taken).
fn unhex(value: &str) -> Option<Vec<u8>> {
    let hex = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X"))?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2048 {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect()
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::from("0x");
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Equal bytes, in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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
    /// CHAP credentials required, if any, and where the exchange stands.
    chap: Option<Arc<Chap>>,
    auth: Auth,
    chap_keys: ChapKeys,
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
            chap: None,
            auth: Auth::Start,
            chap_keys: ChapKeys::default(),
        }
    }

    /// Requires CHAP of this login (`None`: no authentication).
    pub fn with_chap(mut self, chap: Option<Arc<Chap>>) -> Login {
        self.chap = chap;
        self
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
            if self.chap.is_some() {
                // Not without proving the secret.
                return Step::Fail(self.response(bhs, 0, status::AUTH_FAILED));
            }
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
        if let Err(fail) = self.authenticate(&mut answer) {
            return Step::Fail(self.response(bhs, 0, fail));
        }
        // The security stage ends only once CHAP is done, when it is required: until then the
        // target answers without the T bit (RFC 7143 §6.2) and the exchange goes on.
        let transit = transit && !(csg == SECURITY && self.chap.is_some() && self.auth != Auth::Done);
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
        // Keys the target adds after its answer to this one (CHAP_I and CHAP_C after CHAP_A).
        let mut extra: Vec<(String, String)> = Vec::new();
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
                let offered = |m: &str| value.split(',').any(|o| o == m);
                match &self.chap {
                    Some(_) if offered("CHAP") => {
                        self.auth = Auth::Method;
                        reply("CHAP");
                    }
                    None if offered("None") => reply("None"),
                    _ => return Err(status::AUTH_FAILED),
                }
            }
            "CHAP_A" => {
                if self.chap.is_none() || self.auth != Auth::Method {
                    return Err(status::AUTH_FAILED);
                }
                if !value.split(',').any(|a| a == "5") {
                    return Err(status::AUTH_FAILED);
                }
                let mut random = [0u8; 17];
                getrandom::fill(&mut random).map_err(|_| status::TARGET_ERROR)?;
                let (id, challenge) =
                    (random[0], <[u8; 16]>::try_from(&random[1..]).map_err(|_| status::TARGET_ERROR)?);
                self.auth = Auth::Challenged { id, challenge };
                reply("5");
                extra.push(("CHAP_I".into(), id.to_string()));
                extra.push(("CHAP_C".into(), hex(&challenge)));
            }
            "CHAP_N" => self.chap_keys.name = Some(value.to_string()),
            "CHAP_R" => self.chap_keys.response = Some(value.to_string()),
            "CHAP_I" => self.chap_keys.id = Some(value.to_string()),
            "CHAP_C" => self.chap_keys.challenge = Some(value.to_string()),
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
        answer.extend(extra);
        Ok(())
    }
}

impl Login {
    /// Checks the initiator's CHAP response once it came, and answers its own challenge for
    /// mutual CHAP.
    fn authenticate(&mut self, answer: &mut Vec<(String, String)>) -> Result<(), u16> {
        let keys = std::mem::take(&mut self.chap_keys);
        let (Some(chap), Auth::Challenged { id, challenge }) = (&self.chap, self.auth) else {
            if keys.name.is_some() || keys.response.is_some() {
                // CHAP keys out of turn.
                return Err(status::AUTH_FAILED);
            }
            return Ok(());
        };
        let (Some(name), Some(response)) = (keys.name, keys.response) else { return Ok(()) };
        let expected = chap_response(id, &chap.secret, &challenge);
        let proved = unhex(&response).is_some_and(|r| same(&r, &expected));
        if name != chap.user || !proved {
            return Err(status::AUTH_FAILED);
        }
        match (keys.id, keys.challenge) {
            (None, None) => {}
            (Some(i), Some(c)) => {
                let Some((user, secret)) = &chap.mutual else { return Err(status::AUTH_FAILED) };
                let (Ok(i), Some(c)) = (i.parse::<u8>(), unhex(&c)) else { return Err(status::AUTH_FAILED) };
                // The target's own challenge sent back is a reflection attack.
                if c == challenge {
                    return Err(status::AUTH_FAILED);
                }
                answer.push(("CHAP_N".into(), user.clone()));
                answer.push(("CHAP_R".into(), hex(&chap_response(i, secret, &c))));
            }
            _ => return Err(status::AUTH_FAILED),
        }
        self.auth = Auth::Done;
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

    fn chap() -> Arc<Chap> {
        Arc::new(Chap {
            user: "alice".into(),
            secret: b"twelve-bytes-or-more".to_vec(),
            mutual: Some(("target".into(), b"the-target-secret".to_vec())),
        })
    }

    /// Runs the CHAP exchange up to the initiator's response; what it answers to that.
    fn chap_login(user: &str, secret: &[u8], mutual: Option<(u8, &[u8])>) -> Step {
        let mut login = Login::new(Offer::default(), 32).with_chap(Some(chap()));
        let exists = |t: &str| t == "iqn.t";
        let first = request(0x81, "InitiatorName=i;TargetName=iqn.t;AuthMethod=None,CHAP");
        let Step::Continue(bhs, data) = login.step(&first, exists, || 1) else { panic!("continue") };
        assert_eq!(bhs.flags() & 0x80, 0, "no transit before CHAP is done");
        assert!(keys(&data).contains(&("AuthMethod".into(), "CHAP".into())));
        let Step::Continue(_, data) = login.step(&request(0x81, "CHAP_A=7,5"), exists, || 1) else {
            panic!("challenge")
        };
        let k = keys(&data);
        let get = |name: &str| k.iter().find(|(key, _)| key == name).map(|(_, v)| v.clone()).expect(name);
        assert_eq!(get("CHAP_A"), "5");
        let id: u8 = get("CHAP_I").parse().expect("id");
        let challenge = unhex(&get("CHAP_C")).expect("challenge");
        assert_eq!(challenge.len(), 16);
        let mut answer = format!("CHAP_N={user};CHAP_R={}", hex(&chap_response(id, secret, &challenge)));
        if let Some((i, c)) = mutual {
            answer.push_str(&format!(";CHAP_I={i};CHAP_C={}", hex(c)));
        }
        login.step(&request(0x81, &answer), exists, || 1)
    }

    #[test]
    fn chap_admits_the_secret_and_refuses_everything_else() {
        let Step::Continue(bhs, data) = chap_login("alice", b"twelve-bytes-or-more", None) else {
            panic!("admitted")
        };
        assert_eq!(bhs.flags(), 0x81, "on to the operational stage");
        assert!(keys(&data).is_empty());
        for (user, secret) in [("alice", &b"wrong-secret-here"[..]), ("mallory", b"twelve-bytes-or-more")] {
            let Step::Fail(bhs) = chap_login(user, secret, None) else { panic!("{user} admitted") };
            assert_eq!(bhs.u16_at(36), status::AUTH_FAILED);
        }
        // Mutual: the target proves its own secret on the initiator's challenge...
        let c = [7u8; 16];
        let Step::Continue(_, data) = chap_login("alice", b"twelve-bytes-or-more", Some((9, &c))) else {
            panic!("admitted")
        };
        let want = hex(&chap_response(9, b"the-target-secret", &c));
        assert_eq!(keys(&data), [("CHAP_N".into(), "target".into()), ("CHAP_R".into(), want)]);
        // ...and skipping the security stage, or answering without a challenge, gets nowhere.
        let mut login = Login::new(Offer::default(), 32).with_chap(Some(chap()));
        let skip = request(0x87, "InitiatorName=i;TargetName=iqn.t");
        let Step::Fail(bhs) = login.step(&skip, |_| true, || 1) else { panic!("skipped") };
        assert_eq!(bhs.u16_at(36), status::AUTH_FAILED);
        let mut login = Login::new(Offer::default(), 32).with_chap(Some(chap()));
        let early =
            request(0x81, "InitiatorName=i;TargetName=iqn.t;AuthMethod=CHAP;CHAP_N=alice;CHAP_R=0x00");
        let Step::Fail(bhs) = login.step(&early, |_| true, || 1) else { panic!("no challenge") };
        assert_eq!(bhs.u16_at(36), status::AUTH_FAILED);
    }
}
