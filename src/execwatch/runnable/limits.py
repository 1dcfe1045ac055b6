"""Bounds on what hostile input can make a scan or a diagnosis read, build or search."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Defaults fit real images with a wide margin; tests shrink them to prove the bounds."""

    max_uncompressed_bytes: int = 64 << 30  # all layers of one image, after decompression
    max_ratio: int = 1000  # uncompressed / compressed, checked once past ratio_floor
    ratio_floor: int = 256 << 20
    max_entries: int = 2_000_000  # tar members over all layers
    max_tar_header_bytes: int = 1 << 20  # pax and GNU long-name headers are read into memory
    max_text_bytes: int = 16 << 20  # loader configuration kept in memory (fs.wants_text)
    max_link_target_bytes: int = 4095  # symlink targets: a page, as Linux file systems store them
    max_json_bytes: int = 4 << 20  # manifests, indexes, configs (containerd's manifest limit)
    max_json_tokens: int = 100_000  # `{ [ , :` in one document: bounds the objects json builds
    # manifests and configs of one resolution (scan.registry.resolve_images): a real index's
    # are a few hundred KiB; this bounds what a hostile one makes a long-lived process parse
    max_resolution_bytes: int = 8 << 20
    max_index_depth: int = 8
    max_manifests: int = 512
    max_layers: int = 1024
    max_archive_members: int = 100_000  # members of an image archive (blobs, not files)
    # One image, all of its layers (scan.sources.ImageBudget): bytes read from its source, and
    # wall time. 16 GiB compressed is 4x the largest public images (CUDA, ML stacks).
    max_image_bytes: int = 16 << 30
    max_image_seconds: float = 1800.0
    # Its merged tree (runnable.memory.MemoryFS): PATH_MAX / 2 components is the deepest path one
    # syscall names; a large distribution image has a few hundred thousand entries.
    max_tree_depth: int = 2048
    max_tree_nodes: int = 2_000_000
    max_tree_path_bytes: int = 256 << 20  # the entries' paths, which the tree keeps
    # The linker, per executable resolved (runnable.linker.Work): a real program needs a few
    # hundred lookups (100 libraries x 20 directories is 2,000), all well under a second.
    max_linker_probes: int = 1 << 15  # candidate paths looked up: names x directories
    max_linker_steps: int = 1 << 18  # loop iterations: names, path entries, config lines
    max_linker_bytes: int = 16 << 20  # path and configuration text built or read
    max_linker_seconds: float = 5.0
    max_search_dirs: int = 8192  # distinct directories, all sources together
    max_ld_library_path_bytes: int = 128 << 10  # MAX_ARG_STRLEN: exec refuses a longer one
    max_ld_library_path_entries: int = 1024
