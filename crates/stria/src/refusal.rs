//! The kind of failure behind an error of a command (`stria_engine::ErrorKind`), wherever it
//! came from: the engine, the catalog, a volume, or the binary's own checks ([`Refusal`]). The
//! REST API chooses its status code by it ([`crate::http`]), the control socket carries it to the
//! CLI, and nothing chooses by an error's text.

use stria_engine::ErrorKind;

/// A request the binary's own checks refuse (a guard rail, an input the engine never sees), with
/// its kind.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Refusal {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
}

/// A refusal of a request that conflicts with the state of things (clients attached, the last
/// copy of some data, a drive that is failed already).
pub(crate) fn conflict(message: impl Into<String>) -> anyhow::Error {
    Refusal { kind: ErrorKind::Conflict, message: message.into() }.into()
}

/// A refusal of a malformed request.
pub(crate) fn invalid(message: impl Into<String>) -> anyhow::Error {
    Refusal { kind: ErrorKind::InvalidInput, message: message.into() }.into()
}

/// A refusal naming something that does not exist.
pub(crate) fn not_found(message: impl Into<String>) -> anyhow::Error {
    Refusal { kind: ErrorKind::NotFound, message: message.into() }.into()
}

/// The kind of the first typed error in the chain of `e`. A file the request names that cannot
/// be found or opened is the request's fault (invalid input); other I/O errors are the server's.
/// An error of no known type is a conflict: every untyped refusal left in the binary is a guard.
pub(crate) fn kind_of(e: &anyhow::Error) -> ErrorKind {
    e.chain()
        .find_map(|cause| {
            if let Some(r) = cause.downcast_ref::<Refusal>() {
                return Some(r.kind);
            }
            if let Some(c) = cause.downcast_ref::<stria_catalog::CatalogError>() {
                return Some(catalog_kind(c));
            }
            if let Some(t) = cause.downcast_ref::<stria_tier::TierError>() {
                return Some(tier_kind(t));
            }
            if let Some(e) = cause.downcast_ref::<stria_engine::EngineError>() {
                return Some(e.kind());
            }
            if let Some(v) = cause.downcast_ref::<stria_engine::VolumeError>() {
                return Some(v.kind());
            }
            if let Some(io) = cause.downcast_ref::<std::io::Error>() {
                return Some(match io.kind() {
                    std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::AlreadyExists
                    | std::io::ErrorKind::IsADirectory
                    | std::io::ErrorKind::NotADirectory => ErrorKind::InvalidInput,
                    std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => ErrorKind::NoSpace,
                    _ => ErrorKind::Io,
                });
            }
            None
        })
        .unwrap_or(ErrorKind::Conflict)
}

fn catalog_kind(e: &stria_catalog::CatalogError) -> ErrorKind {
    use stria_catalog::CatalogError as C;
    match e {
        C::Engine(e) => e.kind(),
        C::Tier(t) => tier_kind(t),
        C::NotFound(_) => ErrorKind::NotFound,
        C::Invalid(_) => ErrorKind::InvalidInput,
    }
}

fn tier_kind(e: &stria_tier::TierError) -> ErrorKind {
    use stria_tier::TierError as T;
    match e {
        T::Engine(e) => e.kind(),
        T::Volume(v) => v.kind(),
        T::Invalid(_) => ErrorKind::InvalidInput,
        T::Corrupt { .. } => ErrorKind::Unrecoverable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_kind_is_found_through_context_and_by_type_not_text() {
        let engine: anyhow::Error = stria_engine::EngineError::HostFull("the disk is full".into()).into();
        assert_eq!(kind_of(&engine.context("creating volume v")), ErrorKind::Suspended);
        let full = stria_engine::VolumeError::NoSpace {
            volume: "v".into(),
            offset_bytes: 0,
            len_bytes: 4096,
            why: "the segment space is full".into(),
        };
        let catalog: anyhow::Error = stria_catalog::CatalogError::Engine(full.into()).into();
        assert_eq!(kind_of(&catalog), ErrorKind::NoSpace);
        assert_eq!(
            kind_of(&invalid("writes are suspended: a message that looks like another")),
            ErrorKind::InvalidInput
        );
        assert_eq!(kind_of(&not_found("no drive 9")), ErrorKind::NotFound);
        let io = Err::<(), _>(std::io::Error::from(std::io::ErrorKind::NotFound))
            .context("opening /x")
            .unwrap_err();
        assert_eq!(kind_of(&io), ErrorKind::InvalidInput);
        assert_eq!(kind_of(&anyhow::anyhow!("a guard")), ErrorKind::Conflict);
    }
}
