//! larder's repository: the on-disk types and the ordering rules that keep them
//! consistent. The byte layouts are specified in `docs/design/format.md`; each module
//! here implements one of its sections.

mod accounts;
mod backend;
mod chunk_codec;
mod compression;
mod container;
mod direct;
mod error;
mod gc_plan;
pub mod keys;
mod lock;
mod names;
mod partition_object;
mod repo;
mod segment;
mod snapshot;
mod tree;

pub use accounts::{group_name, user_name};
pub use backend::{
    create_file, create_private_dir, private_file_options, Backend, CachedBackend, FileKind,
    FileVersion, LocalBackend, RetryBackend, RetryPolicy, SplitBackend, CONFIG_NAME, DIR_MODE,
    FILE_MODE,
};
#[cfg(feature = "object-store")]
pub use backend::{parse_s3_url, ObjectBackend};
#[cfg(feature = "sftp")]
pub use backend::{parse_sftp_url, SftpBackend, SftpUrl, SshCommand};
pub use chunk_codec::{ChunkCodec, ChunkSeal, IdCode, StoredChunk};
pub use compression::{
    ChunkEncoding, Compression, UnitPlace, DEFAULT_UNIT_CHUNKS, DEFAULT_ZSTD_LEVEL,
    MAX_COMPRESSED_RAW_LEN, MAX_UNIT_CHUNKS, UNIT_RAW_TARGET, ZSTD_LEVELS,
};
pub use container::{
    padded_len, parse_container_table, position, read_container_table, read_table, stored_bytes,
    stored_form, stored_shares, unit_span, ChunkEntry, ContainerBuilder, ContainerTable,
    ParsedContainer, TableLocation, CONTAINER_OVERHEAD, CONTAINER_TAIL_LEN,
    HEADER_LEN as CONTAINER_HEADER_LEN,
};
pub use error::{error_chain, Result, StoreError};
pub use gc_plan::GcPlan;
pub use lock::{
    FlockLock, LockHolder, LockMode, LockObject, ObjectLock, Removal, RemovedLock, RepoLock,
    LOCK_REFRESH, LOCK_STALE_AFTER,
};
pub use names::{escape_controls, escape_name};
pub use partition_object::{object_name, parse_object_name, PartitionObject, PartitionObjectKind};
pub use repo::{
    config_is_sealed, AbsorbedSegments, ChunkBytes, ContainerHealth, ContainerRuns, DiskLookup,
    DiskShape, DiskState, Encryption, GcOptions, GcReport, IdentifiedSnapshot, IndexSettings,
    OpenReport, RepairWork, RepairWriteOptions, RepairWritten, RepoConfig, RepoDiskIndex,
    RepoIndex, Repository, ENCRYPTED_VERSION, MIN_INDEX_MEMORY,
};
pub use segment::{decode_segment, encode_segment, segment_len, SegmentContainer};
pub use snapshot::{Snapshot, SnapshotSummary, TreeRef};
pub use tree::{
    attr_flag_letters, encode_tree, encode_tree_header, is_safe_relative_path, EntryKind,
    FileAsRead, TreeDecoder, TreeEntry, Xattr, ATTR_FLAGS, ATTR_FLAGS_KEPT,
};
