//! Intel ISA-L's erasure-code API, loaded at run time with `dlopen`.
//!
//! The library is looked for, in order: the path given on the command line, `$STRIA_ISAL_LIB`,
//! `.bench/isal/` under the workspace (filled by `scripts/fetch-isal.sh` with 2.31, the first
//! release with GFNI kernels), then the system's `libisal.so.2`.
//!
//! All unsafe code of the benchmark is here: the symbol lookups and the foreign calls.

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use libloading::Library;

type InitTables = unsafe extern "C" fn(c_int, c_int, *mut u8, *mut u8);
type EncodeData = unsafe extern "C" fn(c_int, c_int, c_int, *mut u8, *mut *mut u8, *mut *mut u8);
type EncodeDataUpdate = unsafe extern "C" fn(c_int, c_int, c_int, c_int, *mut u8, *mut u8, *mut *mut u8);
type GenCauchy = unsafe extern "C" fn(*mut u8, c_int, c_int);
type InvertMatrix = unsafe extern "C" fn(*mut u8, *mut u8, c_int) -> c_int;

/// The loaded library and the five functions the benchmark calls.
pub struct Isal {
    path: PathBuf,
    version: String,
    init_tables: InitTables,
    encode_data: EncodeData,
    encode_data_update: EncodeDataUpdate,
    gen_cauchy: GenCauchy,
    invert_matrix: InvertMatrix,
    /// Keeps the function pointers above valid.
    _lib: Library,
}

impl std::fmt::Debug for Isal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Isal").field("path", &self.path).field("version", &self.version).finish()
    }
}

/// Where `scripts/fetch-isal.sh` unpacks the library, relative to the workspace root.
const FETCHED: &str = ".bench/isal/root/usr/lib/x86_64-linux-gnu/libisal.so.2";

impl Isal {
    /// Loads ISA-L from `explicit`, or the first of the default places that has it.
    pub fn load(explicit: Option<&Path>) -> Result<Isal> {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(path) = explicit {
            candidates.push(path.to_owned());
        } else {
            if let Some(path) = std::env::var_os("STRIA_ISAL_LIB") {
                candidates.push(path.into());
            }
            let mut dir = std::env::current_dir().ok();
            while let Some(d) = dir {
                candidates.push(d.join(FETCHED));
                dir = d.parent().map(Path::to_owned);
            }
            candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(FETCHED));
            candidates.push("libisal.so.2".into());
        }
        let mut errors = Vec::new();
        for path in candidates {
            let is_bare_name = path.components().count() == 1;
            if !is_bare_name && !path.exists() {
                continue;
            }
            match Self::open(&path) {
                Ok(isal) => return Ok(isal),
                Err(e) => errors.push(format!("{}: {e:#}", path.display())),
            }
        }
        bail!(
            "ISA-L not found (run scripts/fetch-isal.sh or apt-get install libisal2): {}",
            errors.join("; ")
        )
    }

    fn open(path: &Path) -> Result<Isal> {
        // SAFETY: loading ISA-L runs no initialisers beyond the C runtime's; its multi-binary
        // dispatch resolves CPU features lazily on first call.
        let lib = unsafe { Library::new(path) }.with_context(|| format!("dlopen {}", path.display()))?;
        // SAFETY: the type matches `void ec_init_tables(int, int, unsigned char*, unsigned char*)`.
        let init_tables = *unsafe { lib.get::<InitTables>(b"ec_init_tables\0") }?;
        // SAFETY: matches `void ec_encode_data(int len, int k, int rows, unsigned char *gftbls,
        // unsigned char **data, unsigned char **coding)`.
        let encode_data = *unsafe { lib.get::<EncodeData>(b"ec_encode_data\0") }?;
        // SAFETY: matches `void ec_encode_data_update(int len, int k, int rows, int vec_i,
        // unsigned char *g_tbls, unsigned char *data, unsigned char **coding)`.
        let encode_data_update = *unsafe { lib.get::<EncodeDataUpdate>(b"ec_encode_data_update\0") }?;
        // SAFETY: matches `void gf_gen_cauchy1_matrix(unsigned char *a, int m, int k)`.
        let gen_cauchy = *unsafe { lib.get::<GenCauchy>(b"gf_gen_cauchy1_matrix\0") }?;
        // SAFETY: matches `int gf_invert_matrix(unsigned char *in, unsigned char *out, int n)`.
        let invert_matrix = *unsafe { lib.get::<InvertMatrix>(b"gf_invert_matrix\0") }?;
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| resolve_by_name(path));
        let version = version_from_file_name(&resolved);
        Ok(Isal {
            path: resolved,
            version,
            init_tables,
            encode_data,
            encode_data_update,
            gen_cauchy,
            invert_matrix,
            _lib: lib,
        })
    }

    /// The file actually loaded (symlinks resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version read from the file name, e.g. `2.31` for `libisal.so.2.0.31`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// ISA-L's generator for `k` data and `m` parity shards: `(k + m) x k`, identity on top.
    pub fn cauchy_matrix(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: `a` holds `(k + m) * k` bytes, what the function writes for these arguments.
        unsafe { (self.gen_cauchy)(a.as_mut_ptr(), int(k + m), int(k)) };
        a
    }

    /// Expands a `rows x k` coefficient matrix into ISA-L's multiplication tables.
    pub fn init_tables(&self, k: usize, rows: usize, coefs: &[u8]) -> Vec<u8> {
        assert_eq!(coefs.len(), k * rows);
        let mut tables = vec![0u8; 32 * k * rows];
        let mut coefs = coefs.to_vec();
        // SAFETY: `coefs` holds `k * rows` bytes and `tables` the documented `32 * k * rows`.
        unsafe { (self.init_tables)(int(k), int(rows), coefs.as_mut_ptr(), tables.as_mut_ptr()) };
        tables
    }

    /// Inverts an `n x n` matrix in `scratch` (which it destroys) into `out`; false if singular.
    pub fn invert(&self, scratch: &mut [u8], out: &mut [u8], n: usize) -> bool {
        assert!(scratch.len() >= n * n && out.len() >= n * n);
        // SAFETY: both buffers hold at least `n * n` bytes.
        unsafe { (self.invert_matrix)(scratch.as_mut_ptr(), out.as_mut_ptr(), int(n)) == 0 }
    }

    /// `outputs = tables x inputs` over `len` bytes (ec_encode_data).
    pub fn encode(&self, tables: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], len: usize) {
        let (k, rows) = (inputs.len(), outputs.len());
        assert!(tables.len() >= 32 * k * rows && k <= 255 && rows <= 255);
        assert!(inputs.iter().all(|i| i.len() >= len) && outputs.iter().all(|o| o.len() >= len));
        let mut ins = [std::ptr::null_mut::<u8>(); 255];
        let mut outs = [std::ptr::null_mut::<u8>(); 255];
        for (p, i) in ins.iter_mut().zip(inputs) {
            *p = i.as_ptr().cast_mut();
        }
        for (p, o) in outs.iter_mut().zip(outputs.iter_mut()) {
            *p = o.as_mut_ptr();
        }
        // SAFETY: `len` bytes are readable at every input and writable at every output (checked
        // above), ISA-L only reads the inputs and the tables, and the outputs are exclusive.
        unsafe {
            (self.encode_data)(
                int(len),
                int(k),
                int(rows),
                tables.as_ptr().cast_mut(),
                ins.as_mut_ptr(),
                outs.as_mut_ptr(),
            )
        };
    }

    /// `outputs += tables[.., vec_i] x input` over `len` bytes (ec_encode_data_update).
    pub fn update(
        &self,
        tables: &[u8],
        k: usize,
        vec_i: usize,
        input: &[u8],
        outputs: &mut [&mut [u8]],
        len: usize,
    ) {
        let rows = outputs.len();
        assert!(tables.len() >= 32 * k * rows && vec_i < k && rows <= 255 && input.len() >= len);
        assert!(outputs.iter().all(|o| o.len() >= len));
        let mut outs = [std::ptr::null_mut::<u8>(); 255];
        for (p, o) in outs.iter_mut().zip(outputs.iter_mut()) {
            *p = o.as_mut_ptr();
        }
        // SAFETY: as in `encode`; ISA-L reads `input` and the tables, reads and writes outputs.
        unsafe {
            (self.encode_data_update)(
                int(len),
                int(k),
                int(rows),
                int(vec_i),
                tables.as_ptr().cast_mut(),
                input.as_ptr().cast_mut(),
                outs.as_mut_ptr(),
            )
        };
    }
}

fn int(v: usize) -> c_int {
    c_int::try_from(v).expect("sizes passed to ISA-L fit in an int")
}

/// For a bare soname, the file the dynamic loader would pick, from the usual library folders.
fn resolve_by_name(name: &Path) -> PathBuf {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find_map(|p| std::fs::canonicalize(p).ok())
        .unwrap_or_else(|| name.to_owned())
}

/// `libisal.so.2.0.31` -> `2.31`.
fn version_from_file_name(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    match name.strip_prefix("libisal.so.").map(|v| v.split('.').collect::<Vec<_>>()).as_deref() {
        Some([major, _, minor]) => format!("{major}.{minor}"),
        _ => format!("unknown ({name})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_comes_from_the_file_name() {
        assert_eq!(version_from_file_name(Path::new("/x/libisal.so.2.0.31")), "2.31");
        assert!(version_from_file_name(Path::new("libisal.so.2")).starts_with("unknown"));
    }
}
