"""ctypes bindings for the handful of libbpf (libbpf.so.1) calls execwatch uses.

libbpf is the kernel community's loader: it applies CO-RE relocations against the
running kernel's BTF, creates maps and attaches programs. Binding it directly keeps
nodes free of compilers and of BCC.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from ctypes import POINTER, c_char_p, c_int, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

RingBufferCallback = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
# libbpf_print_fn_t: (level, fmt, va_list); a va_list argument is passed as a pointer.
PrintCallback = ctypes.CFUNCTYPE(c_int, c_int, c_char_p, c_void_p)


class LibbpfMissing(RuntimeError):
    pass


@functools.cache  # one library, and one print hook, per process
def load_libbpf(name: str = "libbpf.so.1") -> ctypes.CDLL:
    """Open libbpf and declare the signatures used here (wrong ones would corrupt pointers).

    The soname is fixed: libbpf 1.x keeps this ABI, and find_library would need a compiler."""
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise LibbpfMissing(f"libbpf not found ({name}): install libbpf1") from exc
    signatures: dict[str, tuple[object, list[object]]] = {
        "bpf_object__open_file": (c_void_p, [c_char_p, c_void_p]),
        "bpf_object__load": (c_int, [c_void_p]),
        "bpf_object__close": (None, [c_void_p]),
        "bpf_object__next_map": (c_void_p, [c_void_p, c_void_p]),
        "bpf_object__find_map_by_name": (c_void_p, [c_void_p, c_char_p]),
        "bpf_object__next_program": (c_void_p, [c_void_p, c_void_p]),
        "bpf_program__name": (c_char_p, [c_void_p]),
        "bpf_program__fd": (c_int, [c_void_p]),
        "bpf_program__attach": (c_void_p, [c_void_p]),
        "bpf_program__set_autoload": (c_int, [c_void_p, ctypes.c_bool]),
        "bpf_object__find_program_by_name": (c_void_p, [c_void_p, c_char_p]),
        "bpf_link__destroy": (c_int, [c_void_p]),
        "bpf_map__name": (c_char_p, [c_void_p]),
        "bpf_map__fd": (c_int, [c_void_p]),
        "bpf_map__set_max_entries": (c_int, [c_void_p, c_uint32]),
        "bpf_map__initial_value": (c_void_p, [c_void_p, POINTER(c_size_t)]),
        "bpf_map__set_initial_value": (c_int, [c_void_p, c_void_p, c_size_t]),
        "bpf_map_lookup_elem": (c_int, [c_int, c_void_p, c_void_p]),
        "bpf_map_get_next_key": (c_int, [c_int, c_void_p, c_void_p]),
        "bpf_map_delete_elem": (c_int, [c_int, c_void_p]),
        "bpf_map_update_elem": (c_int, [c_int, c_void_p, c_void_p, c_uint64]),
        "ring_buffer__new": (c_void_p, [c_int, RingBufferCallback, c_void_p, c_void_p]),
        "ring_buffer__add": (c_int, [c_void_p, c_int, RingBufferCallback, c_void_p]),
        "ring_buffer__poll": (c_int, [c_void_p, c_int]),
        "ring_buffer__consume": (c_int, [c_void_p]),
        "ring_buffer__epoll_fd": (c_int, [c_void_p]),
        "ring_buffer__free": (None, [c_void_p]),
        "libbpf_num_possible_cpus": (c_int, []),
        "libbpf_probe_bpf_helper": (c_int, [c_int, c_int, c_void_p]),
        "libbpf_probe_bpf_map_type": (c_int, [c_int, c_void_p]),
        "bpf_map_create": (c_int, [c_int, c_char_p, c_uint32, c_uint32, c_uint32, c_void_p]),
        "libbpf_set_print": (c_void_p, [PrintCallback]),
        "bpf_object__btf": (c_void_p, [c_void_p]),
        "btf__find_by_name_kind": (c_int, [c_void_p, c_char_p, c_uint32]),
        "btf__type_by_id": (c_void_p, [c_void_p, c_uint32]),
        "btf__name_by_offset": (c_char_p, [c_void_p, c_uint32]),
        "btf__resolve_size": (c_int64, [c_void_p, c_uint32]),
        "btf__resolve_type": (c_int, [c_void_p, c_uint32]),
        "btf__load_vmlinux_btf": (c_void_p, []),
        "btf__free": (None, [c_void_p]),
    }
    for fn, (restype, argtypes) in signatures.items():
        func = getattr(lib, fn)
        func.restype = restype
        func.argtypes = argtypes
    route_prints_to_logging(lib)
    return lib


def route_prints_to_logging(lib: ctypes.CDLL) -> None:
    """libbpf writes to stderr by default; our errors are one line, so its own text goes to
    the log at debug level (verifier output included), where --log-level debug shows it."""
    lib.libbpf_set_print(print_hook())


@functools.cache  # libbpf keeps the pointer: the callback must live as long as the process
def print_hook() -> ctypes._CFunctionType:
    log = logging.getLogger("execwatch.libbpf")
    libc = ctypes.CDLL(None)
    libc.vsnprintf.argtypes = [c_char_p, c_size_t, c_char_p, c_void_p]

    def forward(level: int, fmt: bytes, args: int) -> int:
        buf = ctypes.create_string_buffer(4096)
        libc.vsnprintf(buf, len(buf), fmt, args)
        log.debug(
            buf.value.decode(errors="replace").rstrip(), extra={"kv": {"libbpf_level": level}}
        )
        return 0

    hook: ctypes._CFunctionType = PrintCallback(forward)
    return hook
