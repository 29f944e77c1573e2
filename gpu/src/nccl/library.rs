//! NCCL opened at run time: finding the library, resolving its symbols
//! into a table of function pointers, and thin wrappers that turn C calls
//! into Rust values.
//!
//! The only module besides the stand-in streams, CUDA and `enqueue` that
//! uses `unsafe`: loading runs the library's constructors, and calling
//! through a resolved symbol trusts nccl.h's prototype. Every block says
//! why it holds. A library, once opened, is never closed: NCCL starts
//! threads that would run unmapped code after a `dlclose`.

#![allow(unsafe_code)]

use super::codes::{NcclDataType, NcclRedOp, NcclResult, NcclVersion};
use crate::error::Unavailable;
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct UniqueId {
    /// The bytes, as NCCL wrote them.
    pub internal: [u8; 128],
}

/// The prefix of `ncclConfig_t` that NCCL 2.17 defined. NCCL copies
/// `min(size, sizeof(ncclConfig_t))` bytes and gives fields newer than
/// `version` their defaults, so this prefix stays valid on every later
/// release (`src/init.cc`, `parseCommConfig`).
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: "leave this field at NCCL's default".
const UNDEF_INT: c_int = c_int::MIN;

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
    pub(crate) fn non_blocking() -> Config {
        Config {
            size: size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
        }
    }
}

/// An `ncclComm_t` this crate owns. Neither `Copy` nor `Clone`: destroy
/// and abort take it by value, so no call can follow them.
#[derive(Debug)]
pub(crate) struct RawComm(usize);

impl RawComm {
    fn ptr(&self) -> *mut c_void {
        self.0 as *mut c_void
    }
}

/// A `cudaStream_t` (or the stand-in's), owned by the runtime that made it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawStream(pub(crate) usize);

type GetVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type GetErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;
type GetLastError = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> NcclResult;
type InitRankConfig =
    unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int, *mut Config) -> NcclResult;
type CommCall = unsafe extern "C" fn(*mut c_void) -> NcclResult;
type GetAsyncError = unsafe extern "C" fn(*mut c_void, *mut NcclResult) -> NcclResult;
type CommInt = unsafe extern "C" fn(*mut c_void, *mut c_int) -> NcclResult;
type Group = unsafe extern "C" fn() -> NcclResult;
type Shrink = unsafe extern "C" fn(
    *mut c_void,
    *mut c_int,
    c_int,
    *mut *mut c_void,
    *mut Config,
    c_int,
) -> NcclResult;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    NcclRedOp,
    *mut c_void,
    *mut c_void,
) -> NcclResult;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    c_int,
    *mut c_void,
    *mut c_void,
) -> NcclResult;
type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    NcclRedOp,
    c_int,
    *mut c_void,
    *mut c_void,
) -> NcclResult;
type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    NcclDataType,
    *mut c_void,
    *mut c_void,
) -> NcclResult;
type ReduceScatter = AllReduce;
type Send = unsafe extern "C" fn(
    *const c_void,
    usize,
    NcclDataType,
    c_int,
    *mut c_void,
    *mut c_void,
) -> NcclResult;
type Recv = unsafe extern "C" fn(
    *mut c_void,
    usize,
    NcclDataType,
    c_int,
    *mut c_void,
    *mut c_void,
) -> NcclResult;

/// Every symbol ringwire calls. All exist since NCCL 2.14, the minimum.
struct Symbols {
    get_version: GetVersion,
    get_error_string: GetErrorString,
    get_last_error: GetLastError,
    get_unique_id: GetUniqueId,
    init_rank_config: InitRankConfig,
    finalize: CommCall,
    destroy: CommCall,
    abort: CommCall,
    get_async_error: GetAsyncError,
    count: CommInt,
    user_rank: CommInt,
    cu_device: CommInt,
    group_start: Group,
    group_end: Group,
    all_reduce: AllReduce,
    broadcast: Broadcast,
    reduce: Reduce,
    all_gather: AllGather,
    reduce_scatter: ReduceScatter,
    send: Send,
    recv: Recv,
}

/// The C names of [`Symbols`], in its order: what a test checks the real
/// library for, and what an error lists.
pub(crate) const REQUIRED_SYMBOLS: [&str; 21] = [
    "ncclGetVersion",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclCommCuDevice",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclSend",
    "ncclRecv",
];

/// `NCCL_SHRINK_ABORT`: end the parent's running ops before shrinking.
const SHRINK_ABORT: c_int = 0x01;

/// Where a non-blocking `ncclCommShrink` writes the new communicator: a
/// heap cell NCCL's thread writes when the job ends, which may be after
/// the caller has given up on it. [`ShrinkSlot::take`] frees it once
/// the parent has settled; a slot dropped without it is leaked, never
/// freed under a late write.
#[derive(Debug)]
pub(crate) struct ShrinkSlot(usize);

impl ShrinkSlot {
    fn new() -> ShrinkSlot {
        let cell: Box<*mut c_void> = Box::new(std::ptr::null_mut());
        ShrinkSlot(Box::into_raw(cell).expose_provenance())
    }

    fn ptr(&self) -> *mut *mut c_void {
        std::ptr::with_exposed_provenance_mut(self.0)
    }

    /// The communicator NCCL wrote, if any; call only once the parent's
    /// async error no longer reports in progress (NCCL writes the cell
    /// before that).
    pub(crate) fn take(self) -> Option<RawComm> {
        // SAFETY: the cell came from `Box::into_raw` in `new` and is freed
        // only here, by value; NCCL's job wrote it before the parent left
        // in-progress, which the caller has seen, so nothing writes it now.
        let cell = unsafe { Box::from_raw(self.ptr()) };
        let comm = *cell;
        (!comm.is_null()).then_some(RawComm(comm as usize))
    }
}

/// An opened NCCL (or the stand-in): its path, version and symbols.
pub struct NcclLibrary {
    path: PathBuf,
    version: NcclVersion,
    symbols: Symbols,
    /// `ncclCommShrink`, where the library is 2.27.3 or newer.
    shrink: Option<Shrink>,
    /// The loaded library, for the stand-in's host streams
    /// (`runtime::host`), which it exports beside NCCL's symbols.
    pub(crate) library: &'static Library,
}

impl std::fmt::Debug for NcclLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL {} at {}", self.version, self.path.display())
    }
}

/// Resolves `name` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C prototype of `name` in nccl.h (or the stand-in's
/// header), and `library` must stay loaded while the pointer is used (it is
/// leaked: see the module docs).
pub(crate) unsafe fn symbol<F: Copy>(
    library: &'static Library,
    name: &str,
) -> Result<F, libloading::Error> {
    let mut c_name = name.as_bytes().to_vec();
    c_name.push(0);
    // SAFETY: the caller vouches for the prototype; the library is leaked,
    // so the copied pointer never outlives the code it points to.
    unsafe { library.get::<F>(c_name.as_slice()).map(|s| *s) }
}

impl NcclLibrary {
    /// Opens the NCCL at `path` (a file name is searched as `dlopen` does)
    /// and checks it: every required symbol, and a version no older than
    /// [`NcclVersion::MINIMUM`].
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<NcclLibrary>, Unavailable> {
        let path = path.as_ref();
        // SAFETY: loading runs the library's initialisers. The path names
        // NCCL (or a stand-in with its ABI) by the user's choice or by its
        // file name; NCCL's initialisers only set up its own state.
        let library = unsafe { Library::new(path) }.map_err(|e| Unavailable::NoLibrary {
            tried: vec![path.display().to_string()],
            last_error: e.to_string(),
        })?;
        let library: &'static Library = Box::leak(Box::new(library));
        let missing = |name: &str, e: libloading::Error| Unavailable::MissingSymbol {
            path: path.display().to_string(),
            symbol: name.to_string(),
            detail: e.to_string(),
        };
        macro_rules! resolve {
            ($($field:ident = $name:literal),* $(,)?) => {
                Symbols {
                    // SAFETY: each type alias above copies the prototype of
                    // the named function from nccl.h 2.14 to 2.30, which
                    // have not changed since 2.14.
                    $($field: unsafe { symbol(library, $name) }.map_err(|e| missing($name, e))?,)*
                }
            };
        }
        let symbols = resolve! {
            get_version = "ncclGetVersion",
            get_error_string = "ncclGetErrorString",
            get_last_error = "ncclGetLastError",
            get_unique_id = "ncclGetUniqueId",
            init_rank_config = "ncclCommInitRankConfig",
            finalize = "ncclCommFinalize",
            destroy = "ncclCommDestroy",
            abort = "ncclCommAbort",
            get_async_error = "ncclCommGetAsyncError",
            count = "ncclCommCount",
            user_rank = "ncclCommUserRank",
            cu_device = "ncclCommCuDevice",
            group_start = "ncclGroupStart",
            group_end = "ncclGroupEnd",
            all_reduce = "ncclAllReduce",
            broadcast = "ncclBroadcast",
            reduce = "ncclReduce",
            all_gather = "ncclAllGather",
            reduce_scatter = "ncclReduceScatter",
            send = "ncclSend",
            recv = "ncclRecv",
        };
        let mut code: c_int = 0;
        // SAFETY: ncclGetVersion writes one int through the pointer.
        let result = unsafe { (symbols.get_version)(&mut code) };
        if result != NcclResult::SUCCESS {
            return Err(Unavailable::Broken {
                path: path.display().to_string(),
                detail: format!("ncclGetVersion returned {result}"),
            });
        }
        let version = NcclVersion::from_code(code);
        if version < NcclVersion::MINIMUM {
            return Err(Unavailable::TooOld {
                path: path.display().to_string(),
                found: version,
                minimum: NcclVersion::MINIMUM,
            });
        }
        let shrink = if version >= NcclVersion::SHRINK {
            // SAFETY: the prototype of nccl.h 2.27.3 to 2.30
            // (`ncclCommShrink(ncclComm_t, int*, int, ncclComm_t*,
            // ncclConfig_t*, int)`), unchanged since it came.
            unsafe { symbol::<Shrink>(library, "ncclCommShrink") }.ok()
        } else {
            None
        };
        Ok(Arc::new(NcclLibrary {
            path: path.to_path_buf(),
            version,
            symbols,
            shrink,
            library,
        }))
    }

    /// The process's NCCL, found once: `RINGWIRE_NCCL_LIB` (a path), else
    /// `libnccl.so.2` and `libnccl.so` where `dlopen` looks, else the
    /// `nvidia-nccl-cu*` wheel of a Python on `PATH`
    /// (`<venv>/lib/python3.*/site-packages/nvidia/nccl/lib/libnccl.so.2`,
    /// where PyTorch's wheels put it).
    pub fn global() -> Result<Arc<NcclLibrary>, Unavailable> {
        static GLOBAL: OnceLock<Result<Arc<NcclLibrary>, Unavailable>> = OnceLock::new();
        GLOBAL.get_or_init(find).clone()
    }

    /// The C symbols ringwire binds, every one of which a library must
    /// export to open (NCCL 2.14 and newer do).
    pub const REQUIRED_SYMBOLS: [&'static str; 21] = REQUIRED_SYMBOLS;

    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What `ncclGetVersion` said.
    pub fn version(&self) -> NcclVersion {
        self.version
    }

    /// Whether the library has `ncclCommShrink` (NCCL 2.27.3 and newer),
    /// which [`GpuCommunicator::shrink`](crate::GpuCommunicator::shrink)
    /// then uses instead of making a new communicator.
    pub fn has_shrink(&self) -> bool {
        self.shrink.is_some()
    }

    /// `ncclGetErrorString(code)`.
    pub fn error_string(&self, code: NcclResult) -> String {
        // SAFETY: returns a pointer to a static string (or null).
        let text = unsafe { (self.symbols.get_error_string)(code) };
        c_text(text)
    }

    /// `ncclGetLastError`: the last error NCCL logged for `comm` (or the
    /// process, with `None`), which may be unrelated to the last call.
    pub(crate) fn last_error(&self, comm: Option<&RawComm>) -> String {
        let ptr = comm.map_or(std::ptr::null_mut(), RawComm::ptr);
        // SAFETY: a live comm or null (NCCL then reports its global last
        // error); the string lives until the next NCCL call on this thread,
        // and is copied at once.
        c_text(unsafe { (self.symbols.get_last_error)(ptr) })
    }

    /// `ncclGetUniqueId`.
    pub fn unique_id(&self) -> Result<UniqueId, NcclResult> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`.
        let result = unsafe { (self.symbols.get_unique_id)(&mut id) };
        if result == NcclResult::SUCCESS {
            Ok(id)
        } else {
            Err(result)
        }
    }

    /// `ncclCommInitRankConfig` with `blocking = 0`: the new comm (when
    /// NCCL made one) and the call's result, usually `ncclInProgress`.
    /// The caller's thread must have the device current.
    pub(crate) fn init_rank_non_blocking(
        &self,
        nranks: usize,
        id: UniqueId,
        rank: usize,
    ) -> (Option<RawComm>, NcclResult) {
        let mut comm: *mut c_void = std::ptr::null_mut();
        let mut config = Config::non_blocking();
        // SAFETY: NCCL writes the new handle through `comm` and reads the
        // config, which outlives the call (NCCL copies it).
        let result = unsafe {
            (self.symbols.init_rank_config)(
                &mut comm,
                nranks as c_int,
                id,
                rank as c_int,
                &mut config,
            )
        };
        let comm = (!comm.is_null()).then_some(RawComm(comm as usize));
        (comm, result)
    }

    /// `ncclCommShrink(parent, exclude, .., NULL config, flags)` with
    /// `NCCL_SHRINK_ABORT` when `abort_first`: the call's result (usually
    /// `ncclInProgress`: poll the parent) and the slot the child is
    /// written to. `None` when the library has no `ncclCommShrink`. The
    /// parent must be non-blocking (ringwire's are): NULL inherits that.
    pub(crate) fn shrink_non_blocking(
        &self,
        parent: &RawComm,
        exclude: &[usize],
        abort_first: bool,
    ) -> Option<(NcclResult, ShrinkSlot)> {
        let shrink = self.shrink?;
        // NCCL sorts the list in place: it gets a copy of its own.
        let mut list: Vec<c_int> = exclude.iter().map(|&r| r as c_int).collect();
        let slot = ShrinkSlot::new();
        let flags = if abort_first { SHRINK_ABORT } else { 0 };
        // SAFETY: a live comm; the list is valid for its length during the
        // call (NCCL copies it for its job); the slot is a heap cell that
        // outlives any write (see `ShrinkSlot`); a NULL config inherits the
        // parent's.
        let result = unsafe {
            shrink(
                parent.ptr(),
                list.as_mut_ptr(),
                list.len() as c_int,
                slot.ptr(),
                std::ptr::null_mut(),
                flags,
            )
        };
        Some((result, slot))
    }

    /// `ncclCommGetAsyncError`: the comm's state (in progress, success or
    /// its error), or the call's own failure.
    pub(crate) fn async_error(&self, comm: &RawComm) -> NcclResult {
        let mut state = NcclResult::SUCCESS;
        // SAFETY: a live comm; NCCL writes one result through the pointer.
        let result = unsafe { (self.symbols.get_async_error)(comm.ptr(), &mut state) };
        if result != NcclResult::SUCCESS {
            result
        } else {
            state
        }
    }

    /// `ncclCommAbort`: frees the comm whatever its state; may take long
    /// (the caller bounds it on another thread).
    pub(crate) fn abort(&self, comm: RawComm) -> NcclResult {
        // SAFETY: a live comm, given up by value: nothing calls it again.
        unsafe { (self.symbols.abort)(comm.ptr()) }
    }

    /// `ncclCommFinalize`: flushes the comm's work (non-blocking: returns
    /// in progress; poll [`NcclLibrary::async_error`]).
    pub(crate) fn finalize(&self, comm: &RawComm) -> NcclResult {
        // SAFETY: a live comm.
        unsafe { (self.symbols.finalize)(comm.ptr()) }
    }

    /// `ncclCommDestroy`.
    pub(crate) fn destroy(&self, comm: RawComm) -> NcclResult {
        // SAFETY: a live comm, given up by value.
        unsafe { (self.symbols.destroy)(comm.ptr()) }
    }

    /// `ncclCommCount`, `ncclCommUserRank` and `ncclCommCuDevice`.
    pub(crate) fn comm_info(&self, comm: &RawComm) -> Result<(usize, usize, i32), NcclResult> {
        let (mut count, mut rank, mut device) = (0, 0, 0);
        // SAFETY: a live comm; each writes one int.
        let results = unsafe {
            [
                (self.symbols.count)(comm.ptr(), &mut count),
                (self.symbols.user_rank)(comm.ptr(), &mut rank),
                (self.symbols.cu_device)(comm.ptr(), &mut device),
            ]
        };
        match results.into_iter().find(|r| *r != NcclResult::SUCCESS) {
            Some(bad) => Err(bad),
            None => Ok((count as usize, rank as usize, device)),
        }
    }

    /// `ncclGroupStart`.
    pub(crate) fn group_start(&self) -> NcclResult {
        // SAFETY: no arguments; per-thread state in NCCL.
        unsafe { (self.symbols.group_start)() }
    }

    /// `ncclGroupEnd`.
    pub(crate) fn group_end(&self) -> NcclResult {
        // SAFETY: no arguments; ends this thread's group.
        unsafe { (self.symbols.group_end)() }
    }
}

/// The enqueueing calls. Unsafe: NCCL will read and write device memory at
/// these addresses until the stream passes the op.
impl NcclLibrary {
    /// # Safety
    /// `send` and `recv` address `count` elements of `dtype` on the comm's
    /// device that stay allocated until `stream` has run the op.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                op,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// As [`NcclLibrary::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        root: usize,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.broadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                root as c_int,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// As [`NcclLibrary::all_reduce`] (`recv` is only written on `root`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
        root: usize,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                op,
                root as c_int,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// `send` holds `count` elements and `recv` `count × nranks`, as
    /// [`NcclLibrary::all_reduce`].
    pub(crate) unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// `send` holds `count × nranks` elements and `recv` `count`, as
    /// [`NcclLibrary::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: NcclDataType,
        op: NcclRedOp,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.reduce_scatter)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                op,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// As [`NcclLibrary::all_reduce`], for `buf` alone.
    pub(crate) unsafe fn send(
        &self,
        buf: u64,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.send)(
                buf as *const c_void,
                count,
                dtype,
                peer as c_int,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }

    /// # Safety
    /// As [`NcclLibrary::all_reduce`], for `buf` alone.
    pub(crate) unsafe fn recv(
        &self,
        buf: u64,
        count: usize,
        dtype: NcclDataType,
        peer: usize,
        comm: &RawComm,
        stream: RawStream,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            (self.symbols.recv)(
                buf as *mut c_void,
                count,
                dtype,
                peer as c_int,
                comm.ptr(),
                stream.0 as *mut c_void,
            )
        }
    }
}

fn c_text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: NCCL returns NUL-terminated strings that stay valid at least
    // until the next call on this thread; this copies at once.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// The search behind [`NcclLibrary::global`].
fn find() -> Result<Arc<NcclLibrary>, Unavailable> {
    if let Some(path) = std::env::var_os("RINGWIRE_NCCL_LIB").filter(|p| !p.is_empty()) {
        // An explicit choice is final: falling back would hide its error.
        return NcclLibrary::open(PathBuf::from(path));
    }
    let mut candidates: Vec<PathBuf> = vec!["libnccl.so.2".into(), "libnccl.so".into()];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(NcclLibrary::wheel_libraries(&path));
    }
    let mut tried = Vec::new();
    let mut last_error = String::new();
    for candidate in candidates {
        match NcclLibrary::open(&candidate) {
            Ok(lib) => return Ok(lib),
            Err(Unavailable::NoLibrary {
                tried: t,
                last_error: e,
            }) => {
                tried.extend(t);
                last_error = e;
            }
            // Found but unusable: say so rather than keep looking.
            Err(other) => return Err(other),
        }
    }
    Err(Unavailable::NoLibrary { tried, last_error })
}

impl NcclLibrary {
    /// `libnccl.so.2` inside the `nvidia-nccl-cu*` wheel of each `python3`
    /// or `python` that the `PATH`-style list `path` leads to (a venv's or
    /// conda's `bin/`): the last places [`NcclLibrary::global`] looks.
    pub fn wheel_libraries(path: &std::ffi::OsStr) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for dir in std::env::split_paths(path) {
            if !["python3", "python"].iter().any(|p| dir.join(p).exists()) {
                continue;
            }
            let Some(prefix) = dir.parent() else { continue };
            let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_name().to_string_lossy().starts_with("python3") {
                    continue;
                }
                for packages in ["site-packages", "dist-packages"] {
                    let lib = entry
                        .path()
                        .join(packages)
                        .join("nvidia/nccl/lib/libnccl.so.2");
                    if lib.exists() && !found.contains(&lib) {
                        found.push(lib);
                    }
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_prefix_has_nccl_2_17_layout() {
        // size_t, two u32, four ints, a pointer, an int: 48 bytes on 64-bit.
        assert_eq!(size_of::<Config>(), 48);
        assert_eq!(size_of::<UniqueId>(), 128);
        let c = Config::non_blocking();
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21700, 0));
    }

    #[test]
    fn a_missing_library_is_an_error_naming_the_path() {
        let err = NcclLibrary::open("/nonexistent/libnccl.so.2").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libnccl.so.2"), "{text}");
        assert!(matches!(err, Unavailable::NoLibrary { .. }));
    }
}
