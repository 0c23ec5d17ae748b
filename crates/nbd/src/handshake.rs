//! The fixed newstyle handshake: greeting, client flags, option haggling.
//!
//! Reads are exact (no read-ahead), so the stream can be handed to TLS after `NBD_OPT_STARTTLS`
//! without losing bytes.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::admission::Place;
use crate::config::{Limits, TlsMode};
use crate::export::{Export, ExportRegistry, NamedExport};
use crate::proto::{self, opt, rep, tflag};
use crate::warn_limit::{Kind, Warnings};
use crate::wire::{self, ClientOption, InfoRequest, MetaRequest, OPTION_HEADER_BYTES};

/// What a handshake ended with.
pub(crate) enum HandshakeEnd {
    /// Enter transmission with this export.
    Transmission(Negotiated),
    /// The client asked for TLS and was told yes: upgrade, then negotiate again.
    StartTls,
    /// The client aborted.
    Aborted,
}

/// The settled parameters of a connection, and its place in transmission.
#[derive(Debug)]
pub(crate) struct Negotiated {
    pub(crate) named: NamedExport,
    pub(crate) structured: bool,
    pub(crate) block_status: bool,
    pub(crate) place: Place,
}

/// Why the handshake closed the connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Framing(#[from] wire::FramingError),
    #[error("client flags {0:#x} include unknown bits")]
    BadClientFlags(u32),
    #[error("client does not speak fixed newstyle (client flags {0:#x}); only fixed newstyle is served")]
    NotFixedNewstyle(u32),
    #[error("option {option} carries {len_bytes} bytes, more than the limit of {max_bytes}")]
    OptionTooLarge { option: u32, len_bytes: u32, max_bytes: u32 },
    #[error("more than {0} options in one handshake")]
    TooManyOptions(u32),
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    #[error("NBD_OPT_EXPORT_NAME before TLS while TLS is required")]
    TlsRequired,
    #[error("NBD_OPT_EXPORT_NAME refused: {0}")]
    NoPlace(String),
    /// The TLS handshake after `NBD_OPT_STARTTLS` failed: no or an untrusted client
    /// certificate, or a client that does not trust the server's.
    #[error("TLS handshake failed: {0}")]
    Tls(io::Error),
}

/// Per-connection handshake state. Reset by STARTTLS, as the spec requires.
#[derive(Debug, Default)]
pub(crate) struct NegotiationState {
    pub(crate) no_zeroes: bool,
    pub(crate) tls_active: bool,
    pub(crate) structured: bool,
    /// Canonical export name and whether `base:allocation` was selected for it.
    pub(crate) meta: Option<(String, bool)>,
    pub(crate) options_seen: u32,
}

impl NegotiationState {
    /// Forgets what was negotiated in plaintext; keeps the option count.
    pub(crate) fn start_tls(&mut self) {
        self.tls_active = true;
        self.structured = false;
        self.meta = None;
    }
}

/// What the handshake needs from the server.
pub(crate) struct HandshakeContext<'a> {
    pub(crate) limits: &'a Limits,
    pub(crate) tls_mode: TlsMode,
    pub(crate) registry: &'a dyn ExportRegistry,
    /// Takes a place in transmission for this connection, or says why there is none (the
    /// message for the client; the caller logs the refusal).
    pub(crate) enter_transmission: &'a (dyn Fn() -> Result<Place, String> + Sync),
    /// The client sent a complete message: its handshake is not idle (see `Standing`).
    pub(crate) progressed: &'a (dyn Fn() + Sync),
}

/// Sends the greeting and reads the client flags. Returns whether the client asked for no zeroes.
pub(crate) async fn greet<S>(stream: &mut S) -> Result<bool, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut greeting = [0u8; 18];
    greeting[0..8].copy_from_slice(&proto::NBD_MAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&proto::IHAVEOPT.to_be_bytes());
    greeting[16..18].copy_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    stream.write_all(&greeting).await?;
    stream.flush().await?;
    let client_flags = stream.read_u32().await?;
    if client_flags & !(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES) != 0 {
        return Err(HandshakeError::BadClientFlags(client_flags));
    }
    if client_flags & proto::CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(HandshakeError::NotFixedNewstyle(client_flags));
    }
    Ok(client_flags & proto::CLIENT_NO_ZEROES != 0)
}

/// Transmission flags for `export`.
pub(crate) fn transmission_flags(export: &dyn Export, structured: bool) -> u16 {
    let mut flags = tflag::HAS_FLAGS | tflag::SEND_FLUSH | tflag::SEND_CACHE | tflag::CAN_MULTI_CONN;
    if export.read_only() {
        flags |= tflag::READ_ONLY;
    } else {
        flags |= tflag::SEND_FUA | tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES | tflag::SEND_FAST_ZERO;
    }
    if structured {
        flags |= tflag::SEND_DF;
    }
    flags
}

/// The advertised block sizes: minimum 1, preferred the export's (a power of two between 512 and
/// the maximum), maximum the payload limit.
pub(crate) fn block_sizes(export: &dyn Export, max_payload_bytes: u32) -> (u32, u32, u32) {
    let largest_pow2 = 1u32 << (31 - max_payload_bytes.leading_zeros());
    let preferred =
        export.preferred_block_bytes().max(512).checked_next_power_of_two().unwrap_or(largest_pow2);
    (1, preferred.min(largest_pow2), max_payload_bytes)
}

fn error_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    wire::encode_option_reply(out, option, reply_type, message.as_bytes());
}

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, out: &mut Vec<u8>) -> io::Result<()> {
    stream.write_all(out).await?;
    stream.flush().await?;
    out.clear();
    Ok(())
}

fn unknown_export_message(name: &str, registry: &dyn ExportRegistry) -> String {
    if name.is_empty() {
        let count = registry.names().len();
        format!("no default export: this server has {count} exports; choose one by name (see NBD_OPT_LIST)")
    } else {
        format!("unknown export {name:?}")
    }
}

/// Negotiates until the client enters transmission, asks for TLS or aborts.
pub(crate) async fn negotiate<S>(
    stream: &mut S,
    state: &mut NegotiationState,
    ctx: &HandshakeContext<'_>,
) -> Result<HandshakeEnd, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(512);
    loop {
        let (option, data) = read_option(stream, state, ctx).await?;

        if ctx.tls_mode == TlsMode::Require
            && !state.tls_active
            && option != opt::STARTTLS
            && option != opt::ABORT
        {
            if option == opt::EXPORT_NAME {
                return Err(HandshakeError::TlsRequired);
            }
            debug!(option, "option refused before TLS");
            error_reply(
                &mut out,
                option,
                rep::ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            );
            send(stream, &mut out).await?;
            continue;
        }

        let parsed = match wire::parse_option(option, &data) {
            Ok(parsed) => parsed,
            Err(error) => {
                debug!(option, %error, "invalid option data");
                if option == opt::SET_META_CONTEXT {
                    state.meta = None;
                }
                if option == opt::EXPORT_NAME {
                    return Err(HandshakeError::UnknownExport(String::from_utf8_lossy(&data).into_owned()));
                }
                error_reply(&mut out, option, rep::ERR_INVALID, &error.to_string());
                send(stream, &mut out).await?;
                continue;
            }
        };

        match answer(&mut out, option, parsed, state, ctx)? {
            None => send(stream, &mut out).await?,
            Some(HandshakeEnd::Aborted) => {
                // The client may already have closed; that is fine.
                let _ = send(stream, &mut out).await;
                return Ok(HandshakeEnd::Aborted);
            }
            Some(end) => {
                send(stream, &mut out).await?;
                return Ok(end);
            }
        }
    }
}

/// Reads one option request (header and data) within the handshake's limits.
async fn read_option<S>(
    stream: &mut S,
    state: &mut NegotiationState,
    ctx: &HandshakeContext<'_>,
) -> Result<(u32, Vec<u8>), HandshakeError>
where
    S: AsyncRead + Unpin,
{
    let mut header = [0u8; OPTION_HEADER_BYTES];
    stream.read_exact(&mut header).await?;
    let header = wire::parse_option_header(&header)?;
    state.options_seen += 1;
    if state.options_seen > ctx.limits.max_options_per_handshake {
        return Err(HandshakeError::TooManyOptions(ctx.limits.max_options_per_handshake));
    }
    if header.len_bytes > ctx.limits.max_option_bytes {
        return Err(HandshakeError::OptionTooLarge {
            option: header.option,
            len_bytes: header.len_bytes,
            max_bytes: ctx.limits.max_option_bytes,
        });
    }
    let mut data = vec![0u8; header.len_bytes as usize];
    stream.read_exact(&mut data).await?;
    (ctx.progressed)();
    Ok((header.option, data))
}

/// Puts the reply to one parsed option into `out`; `Some` when the option ends the handshake
/// (the caller sends `out` either way).
fn answer(
    out: &mut Vec<u8>,
    option: u32,
    parsed: ClientOption,
    state: &mut NegotiationState,
    ctx: &HandshakeContext<'_>,
) -> Result<Option<HandshakeEnd>, HandshakeError> {
    match parsed {
        ClientOption::ExportName(name) => {
            let named = ctx.registry.lookup(&name).ok_or(HandshakeError::UnknownExport(name))?;
            let place = (ctx.enter_transmission)().map_err(HandshakeError::NoPlace)?;
            let negotiated = finish(state, named, place);
            let flags = transmission_flags(negotiated.named.export.as_ref(), negotiated.structured);
            out.extend_from_slice(&negotiated.named.export.size_bytes().to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
            if !state.no_zeroes {
                out.extend_from_slice(&[0u8; 124]);
            }
            return Ok(Some(HandshakeEnd::Transmission(negotiated)));
        }
        ClientOption::Abort => {
            wire::encode_option_reply(out, option, rep::ACK, &[]);
            return Ok(Some(HandshakeEnd::Aborted));
        }
        ClientOption::List => {
            for name in ctx.registry.names() {
                let description = ctx.registry.lookup(&name).and_then(|named| named.export.description());
                let payload = wire::rep_server_payload(&name, description.as_deref());
                wire::encode_option_reply(out, option, rep::SERVER, &payload);
            }
            wire::encode_option_reply(out, option, rep::ACK, &[]);
        }
        ClientOption::StartTls => match (ctx.tls_mode, state.tls_active) {
            (TlsMode::Off, _) => {
                error_reply(out, option, rep::ERR_POLICY, "TLS is not enabled on this server")
            }
            (_, true) => error_reply(out, option, rep::ERR_INVALID, "TLS is already active"),
            (_, false) => {
                wire::encode_option_reply(out, option, rep::ACK, &[]);
                return Ok(Some(HandshakeEnd::StartTls));
            }
        },
        ClientOption::Info(request) => {
            info_reply(out, option, &request, state, ctx);
        }
        ClientOption::Go(request) => {
            // A place in transmission is taken before anything is promised; without one the
            // client hears why and may try again (or leave) within the handshake timeout.
            let place = if ctx.registry.lookup(&request.name).is_some() {
                match (ctx.enter_transmission)() {
                    Ok(place) => Some(place),
                    Err(message) => {
                        error_reply(out, option, rep::ERR_POLICY, &message);
                        return Ok(None);
                    }
                }
            } else {
                None
            };
            if let Some(named) = info_reply(out, option, &request, state, ctx) {
                let place = place.expect("a place was taken for an export that exists");
                return Ok(Some(HandshakeEnd::Transmission(finish(state, named, place))));
            }
        }
        ClientOption::StructuredReply => {
            state.structured = true;
            wire::encode_option_reply(out, option, rep::ACK, &[]);
        }
        ClientOption::ListMetaContext(request) => meta_reply(out, option, &request, true, state, ctx),
        ClientOption::SetMetaContext(request) => meta_reply(out, option, &request, false, state, ctx),
        ClientOption::Unknown(code) => {
            debug!(option = code, "unknown option");
            error_reply(out, code, rep::ERR_UNSUP, "option not supported by this server");
        }
    }
    Ok(None)
}

/// Settles the connection parameters for `named`.
fn finish(state: &NegotiationState, named: NamedExport, place: Place) -> Negotiated {
    let block_status =
        state.structured && matches!(&state.meta, Some((meta_name, true)) if *meta_name == named.name);
    Negotiated { named, structured: state.structured, block_status, place }
}

/// Encodes the reply to INFO or GO; returns the export on success.
fn info_reply(
    out: &mut Vec<u8>,
    option: u32,
    request: &InfoRequest,
    state: &NegotiationState,
    ctx: &HandshakeContext<'_>,
) -> Option<NamedExport> {
    let Some(named) = ctx.registry.lookup(&request.name) else {
        error_reply(out, option, rep::ERR_UNKNOWN, &unknown_export_message(&request.name, ctx.registry));
        return None;
    };
    let export = named.export.as_ref();
    let flags = transmission_flags(export, state.structured);
    wire::encode_option_reply(out, option, rep::INFO, &wire::info_export_payload(export.size_bytes(), flags));
    if request.info_types.contains(&proto::info::NAME) {
        let payload = wire::info_string_payload(proto::info::NAME, &named.name);
        wire::encode_option_reply(out, option, rep::INFO, &payload);
    }
    if request.info_types.contains(&proto::info::DESCRIPTION)
        && let Some(description) = export.description()
    {
        let mut cut = description.len().min(proto::MAX_STRING_BYTES);
        while !description.is_char_boundary(cut) {
            cut -= 1;
        }
        let payload = wire::info_string_payload(proto::info::DESCRIPTION, &description[..cut]);
        wire::encode_option_reply(out, option, rep::INFO, &payload);
    }
    let (minimum, preferred, maximum) = block_sizes(export, ctx.limits.max_payload_bytes);
    let payload = wire::info_block_size_payload(minimum, preferred, maximum);
    wire::encode_option_reply(out, option, rep::INFO, &payload);
    wire::encode_option_reply(out, option, rep::ACK, &[]);
    Some(named)
}

/// Encodes the reply to LIST_META_CONTEXT (`listing`) or SET_META_CONTEXT.
fn meta_reply(
    out: &mut Vec<u8>,
    option: u32,
    request: &MetaRequest,
    listing: bool,
    state: &mut NegotiationState,
    ctx: &HandshakeContext<'_>,
) {
    if !listing {
        state.meta = None;
    }
    if !state.structured {
        error_reply(out, option, rep::ERR_INVALID, "negotiate NBD_OPT_STRUCTURED_REPLY first");
        return;
    }
    let Some(named) = ctx.registry.lookup(&request.export_name) else {
        error_reply(
            out,
            option,
            rep::ERR_UNKNOWN,
            &unknown_export_message(&request.export_name, ctx.registry),
        );
        return;
    };
    let selected = if listing && request.queries.is_empty() {
        true
    } else {
        request.queries.iter().any(|query| wire::query_selects_base_allocation(query, listing))
    };
    if selected {
        let id = if listing { 0 } else { proto::BASE_ALLOCATION_ID };
        let payload = wire::rep_meta_context_payload(id, proto::BASE_ALLOCATION);
        wire::encode_option_reply(out, option, rep::META_CONTEXT, &payload);
    }
    wire::encode_option_reply(out, option, rep::ACK, &[]);
    if !listing {
        state.meta = Some((named.name, selected));
    }
}

/// Logs a handshake that closed the connection (warnings rate-limited by `warnings`).
pub(crate) fn log_handshake_error(peer: &str, error: &HandshakeError, warnings: &Warnings) {
    match error {
        HandshakeError::Io(io_error) if io_error.kind() == io::ErrorKind::UnexpectedEof => {
            debug!(peer, "client left during the handshake");
        }
        HandshakeError::Io(io_error) => debug!(peer, %io_error, "handshake I/O error"),
        // Logged (rate-limited) where the place was refused.
        HandshakeError::NoPlace(_) => debug!(peer, error = %error, "handshake refused"),
        other => warnings.warn(Kind::HandshakeRefused, |left_out| {
            warn!(peer, error = %other, left_out, "handshake refused");
        }),
    }
}
