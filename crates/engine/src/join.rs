//! Waiting for several operations at once without cancelling any of them.

use std::future::Future;

/// Runs every future to completion and returns their outputs, or the first error (in input
/// order) once *all* of them have finished.
///
/// `futures::try_join_all` drops the other futures at the first error. Dropping an engine
/// operation half way leaves its work half done (a journal batch written for other waiters, an
/// intent bit held for good, a write on the device with its checksum never recorded), so inside
/// the engine and the tier sibling operations always finish.
pub async fn join_all_ok<T, E, F>(futures: impl IntoIterator<Item = F>) -> Result<Vec<T>, E>
where
    F: Future<Output = Result<T, E>>,
{
    futures::future::join_all(futures).await.into_iter().collect()
}
