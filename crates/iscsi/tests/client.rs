//! A small iSCSI initiator for the tests: one connection, login in one request, SCSI commands
//! one at a time with immediate data or R2Ts, raw bytes for hostile input.

use std::time::Duration;

use stria_iscsi::pdu::{self, Bhs, Digests, NO_TAG, Pdu, op};
use stria_iscsi::text;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) struct Client {
    pub(crate) stream: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
    itt: u32,
    digests: Digests,
}

/// A command's outcome.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) status: u8,
    pub(crate) data: Vec<u8>,
    pub(crate) sense: Vec<u8>,
}

impl Client {
    pub(crate) async fn connect(addr: std::net::SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.expect("connect");
        Client { stream, cmd_sn: 1, exp_stat_sn: 0, itt: 1, digests: Digests::default() }
    }

    pub(crate) async fn send(&mut self, bhs: Bhs, data: &[u8]) -> std::io::Result<()> {
        let mut out = Vec::new();
        pdu::encode_pdu(&mut out, bhs, data, self.digests);
        self.stream.write_all(&out).await
    }

    pub(crate) async fn read(&mut self) -> std::io::Result<Pdu> {
        pdu::read_pdu(&mut self.stream, self.digests, 1 << 24)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Logs in to `target` (operational stage straight to the full feature phase) with the
    /// keys given beside the names; the login status when it fails.
    pub(crate) async fn login(
        &mut self,
        target: &str,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, u16> {
        let mut pairs: Vec<(String, String)> = vec![
            ("InitiatorName".into(), "iqn.2026-11.test:client".into()),
            ("SessionType".into(), if target.is_empty() { "Discovery" } else { "Normal" }.into()),
        ];
        if !target.is_empty() {
            pairs.push(("TargetName".into(), target.into()));
        }
        pairs.extend(keys.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut bhs = Bhs::new(op::LOGIN);
        bhs.0[0] |= 0x40;
        bhs.0[1] = 0x87;
        bhs.set_u64(8, 0x0002_3d00_0001_0000).set_u32(16, 0).set_u32(24, self.cmd_sn);
        self.send(bhs, &text::encode(&pairs)).await.expect("send login");
        let resp = self.read().await.expect("login response");
        let status = resp.bhs.u16_at(36);
        if status != 0 {
            return Err(status);
        }
        assert_eq!(resp.bhs.flags() & 0x83, 0x83, "the login went to the full feature phase");
        self.exp_stat_sn = resp.bhs.u32_at(24).wrapping_add(1);
        let answer = text::parse(&resp.data).expect("keys");
        let crc = |k: &str| answer.iter().any(|(key, v)| key == k && v == "CRC32C");
        self.digests = Digests { header: crc("HeaderDigest"), data: crc("DataDigest") };
        if !target.is_empty() {
            // A new I_T nexus has a unit attention (29h/00h, POWER ON OR RESET) that its first
            // command reports, as initiators expect: TEST UNIT READY takes it.
            let first = self.command(&[0; 6], &[], 0, 0).await;
            assert_eq!((first.status, first.sense.get(12)), (2, Some(&0x29)), "{:02x?}", first.sense);
            let second = self.command(&[0; 6], &[], 0, 0).await;
            assert_eq!(second.status, 0, "the unit attention is reported once");
        }
        Ok(answer)
    }

    /// Runs a command: `data_out` goes as immediate data up to `immediate` bytes, the rest when
    /// the target asks for it (R2T); `read_len` is the data expected back.
    pub(crate) async fn command(
        &mut self,
        cdb: &[u8],
        data_out: &[u8],
        immediate: usize,
        read_len: u32,
    ) -> Outcome {
        let itt = self.itt;
        self.itt += 1;
        let mut bhs = Bhs::new(op::SCSI_COMMAND);
        let write = !data_out.is_empty();
        bhs.0[1] = 0x80 | if read_len > 0 { 0x40 } else { 0 } | if write { 0x20 } else { 0 };
        let edtl = if write { u32::try_from(data_out.len()).expect("small") } else { read_len };
        bhs.set_u32(16, itt).set_u32(20, edtl).set_u32(24, self.cmd_sn).set_u32(28, self.exp_stat_sn);
        self.cmd_sn += 1;
        bhs.0[32..32 + cdb.len()].copy_from_slice(cdb);
        let first = immediate.min(data_out.len());
        self.send(bhs, &data_out[..first]).await.expect("send command");
        let mut data = Vec::new();
        loop {
            let p = self.read().await.expect("an answer");
            match p.bhs.opcode() {
                op::R2T => {
                    let (ttt, offset, len) =
                        (p.bhs.u32_at(20), p.bhs.u32_at(40) as usize, p.bhs.u32_at(44) as usize);
                    for (sn, chunk) in data_out[offset..offset + len].chunks(8192).enumerate() {
                        let mut d = Bhs::new(op::DATA_OUT);
                        let at = offset + sn * 8192;
                        if at + chunk.len() == offset + len {
                            d.0[1] = 0x80;
                        }
                        d.set_u32(16, itt).set_u32(20, ttt).set_u32(36, sn as u32).set_u32(40, at as u32);
                        self.send(d, chunk).await.expect("send data-out");
                    }
                }
                op::DATA_IN => {
                    data.extend_from_slice(&p.data);
                    if p.bhs.flags() & 0x01 != 0 {
                        self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                        return Outcome { status: p.bhs.0[3], data, sense: Vec::new() };
                    }
                }
                op::SCSI_RESPONSE => {
                    self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                    let sense = if p.data.len() > 2 { p.data[2..].to_vec() } else { Vec::new() };
                    return Outcome { status: p.bhs.0[3], data, sense };
                }
                other => panic!("unexpected PDU {other:#04x} for a command"),
            }
        }
    }

    /// True when the target closes the connection within `within` (whatever it sends first).
    pub(crate) async fn closed_within(&mut self, within: Duration) -> bool {
        let mut buf = vec![0; 64 * 1024];
        let read_to_end = async {
            loop {
                match self.stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(within, read_to_end).await.is_ok()
    }

    /// A NOP-Out ping answered by a NOP-In with its data.
    pub(crate) async fn ping(&mut self, data: &[u8]) -> Vec<u8> {
        let itt = self.itt;
        self.itt += 1;
        let mut bhs = Bhs::new(op::NOP_OUT);
        bhs.0[0] |= 0x40;
        bhs.0[1] = 0x80;
        bhs.set_u32(16, itt).set_u32(20, NO_TAG).set_u32(24, self.cmd_sn);
        self.send(bhs, data).await.expect("send nop");
        let p = self.read().await.expect("nop-in");
        assert_eq!((p.bhs.opcode(), p.bhs.itt()), (op::NOP_IN, itt));
        p.data
    }
}

pub(crate) fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    c
}

pub(crate) fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2A;
    c
}
