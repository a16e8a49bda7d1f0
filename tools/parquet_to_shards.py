#!/usr/bin/env python3
"""Parquet files (FineWeb's form: one document per row in a string column `text`) -> lrnn token
shards, the directory `lrnn tokenize` writes (docs/DATA.md is the specification both follow).

    .venv/bin/python tools/parquet_to_shards.py --tokenizer tok.model --input a.parquet b.parquet \\
        --out data/fw [--val-fraction 0.01] [--seed 0] [--shard-tokens 100000000] [--column text] \\
        [--threads 0] [--batch-rows 1024] [--force] [--quiet]

For the same documents, tokenizer, --seed, --val-fraction and --shard-tokens the shards are
byte-identical to `lrnn tokenize`'s, and index.json holds the same values except `created_by`,
`command`, `inputs`, `text_unit` ("parquet-row") and `parquet_column` (in place of
`jsonl_field`):
  - documents are the rows, the files in the order given and the rows in file order; document i
    counts from 0 over all files, empty texts included (they write no tokens);
  - the validation documents are drawn by the same rule: the k = max(1, round(f * n)) documents
    with the smallest Philox4x32-10 keys at (seed, stream "vals", i), reimplemented here with
    NumPy (philox4x32 below; checked against lrnn on many seeds by tests/python/test_lm_data.py);
  - a document is BOS tokens EOS (tokens EOS without BOS), tokens from SentencePiece's Encode
    with no options, through the Python binding of the library lrnn links (Debian's
    python3-sentencepiece);
  - the split's stream is cut into shards of exactly --shard-tokens tokens, with lrnn's 128-byte
    header (CRC-32 = zlib.crc32 of the token bytes).

Errors (a missing or non-Parquet file, a missing column, a null or non-UTF-8 text, bad options)
are one line naming the file on stderr and exit code 2.
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys
import time
import zlib

import numpy as np

MAGIC = b"LRNNTOKS"
VERSION = 1
HEADER_BYTES = 128
SPLIT_CODE = {"train": 1, "val": 2}
MAX_SHARDS_PER_SPLIT = 1000000
MAX_SHARD_TOKENS = 1 << 30
MAX_TOKENIZER_BYTES = 256 << 20
VAL_STREAM = 0x76616C73  # "vals"


class UserError(Exception):
    """A bad input or option: printed as one line, exit code 2."""


# ---------------------------------------------------------------------------------------------
# Philox4x32-10 (src/core/rng.h), vectorised over counters.

def philox4x32(c0, c1, c2, c3, seed):
    """Philox4x32-10 of counters (c0, c1, c2, c3) (uint64 arrays holding 32-bit values) under the
    key (seed mod 2^32, seed div 2^32); returns the four output words as uint64 arrays."""
    m32 = np.uint64(0xFFFFFFFF)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = c0 * np.uint64(0xD2511F53)  # < 2^64: exact
        p1 = c2 * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & m32)
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def rng_keys(seed, stream, first, count):
    """The 64-bit keys v[1] * 2^32 + v[0] of Rng{seed, stream}.block(i), i in [first, first + count)."""
    i = np.arange(first, first + count, dtype=np.uint64)
    m32 = np.uint64(0xFFFFFFFF)
    c0, c1 = i & m32, i >> np.uint64(32)
    c2 = np.full(count, stream & 0xFFFFFFFF, dtype=np.uint64)
    c3 = np.full(count, (stream >> 32) & 0xFFFFFFFF, dtype=np.uint64)
    v0, v1, _, _ = philox4x32(c0, c1, c2, c3, seed)
    return (v1 << np.uint64(32)) | v0


def round_half_away(x):
    """C's llround for x >= 0 (Python's round() rounds halves to even)."""
    r = math.floor(x)
    return r + 1 if x - r >= 0.5 else r


def validation_count(n, fraction):
    if not (0.0 <= fraction <= 0.5):
        raise UserError(f"--val-fraction {fraction}: expected 0..0.5")
    if fraction == 0.0:
        return 0
    k = max(1, round_half_away(fraction * float(n)))
    if k >= n:
        raise UserError(f"{n} document{'' if n == 1 else 's'}: a validation split of {k} leaves no document to "
                        "train on (it takes whole documents; give more documents or --val-fraction 0)")
    return k


def validation_documents(n, fraction, seed, chunk=1 << 20):
    """Sorted indices of the validation documents (lrnn's validation_documents)."""
    k = validation_count(n, fraction)
    if k == 0:
        return np.zeros(0, dtype=np.uint64)
    best_keys = np.zeros(0, dtype=np.uint64)
    best_idx = np.zeros(0, dtype=np.uint64)
    for first in range(0, n, chunk):
        count = min(chunk, n - first)
        keys = np.concatenate([best_keys, rng_keys(seed, VAL_STREAM, first, count)])
        idx = np.concatenate([best_idx, np.arange(first, first + count, dtype=np.uint64)])
        order = np.lexsort((idx, keys))[:k]  # smallest (key, index) pairs
        best_keys, best_idx = keys[order], idx[order]
    return np.sort(best_idx)


# ---------------------------------------------------------------------------------------------
# Shards

def token_bytes_for(vocab_size):
    return 2 if vocab_size <= 65536 else 4


def shard_file_name(split, index):
    return f"{split}_{index:06d}.bin"


def shard_header(num_tokens, num_documents, token_bytes, vocab_size, crc, split, tokenizer_sha256, index):
    """The 128-byte header (docs/DATA.md, "Shard files")."""
    assert len(tokenizer_sha256) == 32
    h = MAGIC + struct.pack("<IIQQIIII", VERSION, HEADER_BYTES, num_tokens, num_documents, token_bytes, vocab_size,
                            crc, SPLIT_CODE[split])
    h += tokenizer_sha256 + struct.pack("<Q", index)
    return h + bytes(HEADER_BYTES - len(h))


def write_file_atomic(path, data):
    """As lrnn's io::write_file_atomic: a temporary in the same directory, fsync, rename, fsync the directory."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write {path}: {e.strerror or e}")
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """The tokens of one split, cut into shards of shard_tokens and written as each fills (lrnn's
    SplitWriter): a shard counts the documents whose first token lies in it."""

    def __init__(self, out_dir, split, shard_tokens, vocab_size, tokenizer_sha256, quiet=True):
        self.dir, self.split, self.shard_tokens, self.vocab_size = out_dir, split, shard_tokens, vocab_size
        self.sha = tokenizer_sha256
        self.token_bytes = token_bytes_for(vocab_size)
        self.dtype = np.dtype("<u2" if self.token_bytes == 2 else "<u4")
        self.quiet = quiet
        self.chunks, self.in_buf, self.docs_in_buf = [], 0, 0
        self.index, self.tokens, self.documents = 0, 0, 0
        self.shards, self.files = [], []

    def add_document(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise UserError(f"a token id outside the vocabulary of {self.vocab_size}")
        ids = ids.astype(self.dtype)
        self.documents += 1
        i, first = 0, True
        while i < ids.size:
            if self.in_buf == self.shard_tokens:
                self._flush()
            take = min(ids.size - i, self.shard_tokens - self.in_buf)
            if first:
                self.docs_in_buf += 1
            first = False
            self.chunks.append(ids[i:i + take])
            self.in_buf += take
            i += take

    def finish(self):
        if self.in_buf > 0:
            self._flush()

    def _flush(self):
        if self.index >= MAX_SHARDS_PER_SPLIT:
            raise UserError(f"the {self.split} split needs more than {MAX_SHARDS_PER_SPLIT} shards of "
                            f"{self.shard_tokens} tokens; give a larger --shard-tokens")
        payload = np.concatenate(self.chunks).tobytes() if self.chunks else b""
        crc = zlib.crc32(payload) & 0xFFFFFFFF
        name = shard_file_name(self.split, self.index)
        head = shard_header(self.in_buf, self.docs_in_buf, self.token_bytes, self.vocab_size, crc, self.split,
                            self.sha, self.index)
        write_file_atomic(os.path.join(self.dir, name), head + payload)
        if not self.quiet:
            print(f"parquet_to_shards: wrote {os.path.join(self.dir, name)} ({self.in_buf} tokens)", file=sys.stderr)
        self.shards.append({"file": name, "tokens": self.in_buf, "documents": self.docs_in_buf, "crc32": crc})
        self.files.append(name)
        self.tokens += self.in_buf
        self.index += 1
        self.chunks, self.in_buf, self.docs_in_buf = [], 0, 0

    def summary(self):
        return {"shards": self.shards, "tokens": self.tokens, "documents": self.documents}


def is_shard_name(name):
    for prefix in ("train_", "val_"):
        if (len(name) == len(prefix) + 10 and name.startswith(prefix) and name.endswith(".bin")
                and name[len(prefix):-4].isascii() and name[len(prefix):-4].isdigit()):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Inputs

# The checks lrnn makes before SentencePiece sees a model file (src/data/tokenizer.cpp,
# check_model_proto): SentencePiece terminates the process on a piece holding a NUL byte, and
# indexes a normalisation rule's precompiled trie without bounds checks.

def _wire_fields(b):
    """(number, wire type, bytes or None) of each field of a protobuf message; ValueError if broken."""
    pos, n = 0, len(b)

    def varint():
        nonlocal pos
        v = shift = 0
        while shift < 64:
            if pos >= n:
                raise ValueError
            c = b[pos]
            pos += 1
            v |= (c & 0x7F) << shift
            if not c & 0x80:
                return v
            shift += 7
        raise ValueError

    while pos < n:
        key = varint()
        num, typ = key >> 3, key & 7
        if num == 0:
            raise ValueError
        if typ == 0:
            varint()
            yield num, typ, None
        elif typ in (1, 5):
            size = 8 if typ == 1 else 4
            if n - pos < size:
                raise ValueError
            pos += size
            yield num, typ, None
        elif typ == 2:
            size = varint()
            if size > n - pos:
                raise ValueError
            yield num, typ, b[pos:pos + size]
            pos += size
        else:
            raise ValueError


def _check_charsmap(blob):
    if not blob:
        return None
    if len(blob) <= 4:
        return f"a normalisation rule of {len(blob)} bytes"
    (trie_bytes,) = struct.unpack_from("<I", blob, 0)
    if trie_bytes == 0 or trie_bytes % 4 or trie_bytes > len(blob) - 4:
        return f"a normalisation rule whose trie claims {trie_bytes} of its {len(blob)} bytes"
    strings = blob[4 + trie_bytes:]
    if not strings or strings[-1] != 0:
        return "a normalisation rule whose strings do not end with NUL"
    units = np.frombuffer(blob, dtype="<u4", count=trie_bytes // 4, offset=4).astype(np.uint64)
    n = units.size
    idx = np.arange(n, dtype=np.uint64)
    offset = (units >> np.uint64(10)) << ((units & np.uint64(1 << 9)) >> np.uint64(6))
    base = idx ^ offset
    followed = (units >> np.uint64(31)) == 0
    followed[0] = True
    bad = np.flatnonzero(followed & ((base | np.uint64(0xFF)) >= np.uint64(n)))
    if bad.size:
        return f"a normalisation rule whose trie unit {bad[0]} points outside it"
    leaf = np.flatnonzero(followed & (((units >> np.uint64(8)) & np.uint64(1)) == 1))
    if leaf.size:
        values = units[base[leaf].astype(np.int64)] & np.uint64(0x7FFFFFFF)
        over = np.flatnonzero(values >= np.uint64(len(strings)))
        if over.size:
            return f"a normalisation rule whose trie unit {leaf[over[0]]} points outside its strings"
    return None


def check_model_proto(data):
    """None when SentencePiece may be given `data`, else what is wrong (as lrnn says it)."""
    pieces = 0
    try:
        for num, typ, sub in _wire_fields(data):
            if typ != 2:
                continue
            if num == 1:
                got = False
                for n2, t2, piece in _wire_fields(sub):
                    if n2 != 1 or t2 != 2:
                        continue
                    got = True
                    if not piece:
                        return f"piece {pieces} is empty"
                    if 0 in piece:
                        return f"piece {pieces} holds a NUL byte"
                    try:
                        piece.decode("utf-8")
                    except UnicodeDecodeError:
                        return f"piece {pieces} is not valid UTF-8"
                if not got:
                    return f"piece {pieces} is empty"
                pieces += 1
            elif num in (3, 5):
                for n2, t2, blob in _wire_fields(sub):
                    if n2 == 2 and t2 == 2:
                        e = _check_charsmap(blob)
                        if e:
                            return e
    except ValueError:
        return "broken protobuf data"
    return None


def load_tokenizer(path):
    import sentencepiece as spm
    if not os.path.exists(path):
        raise UserError(f"{path}: no such tokenizer file (a SentencePiece .model)")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not a regular file")
    if os.path.getsize(path) > MAX_TOKENIZER_BYTES:
        raise UserError(f"{path}: more than the {MAX_TOKENIZER_BYTES} bytes a tokenizer may have")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise UserError(f"{path}: empty file, not a SentencePiece model")
    problem = check_model_proto(data)
    if problem:
        raise UserError(f"{path}: not a SentencePiece model lrnn can load: {problem}")
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(data)
    except (RuntimeError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a SentencePiece model (SentencePiece says: {e})")
    vocab = sp.get_piece_size()
    if vocab <= 0:
        raise UserError(f"{path}: a SentencePiece model without pieces")
    for i in (sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id()):
        if i < -1 or i >= vocab:
            raise UserError(f"{path}: a special token id {i} outside the vocabulary of {vocab} pieces")
    if sp.eos_id() < 0:
        raise UserError(f"{path}: the tokenizer defines no EOS token; documents end with EOS")
    return sp, data


def open_parquet(path, column):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not os.path.exists(path):
        raise UserError(f"{path}: no such input file")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not a regular file; inputs are read only from regular files")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a Parquet file ({e})")
    names = pf.schema_arrow.names
    if column not in names:
        raise UserError(f"{path}: no column \"{column}\" (columns: {', '.join(names)}); --column names the text")
    t = pf.schema_arrow.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        raise UserError(f"{path}: column \"{column}\" has type {t}, not text")
    return pf


def documents(files, column, batch_rows):
    """Yields (file index, row, text) for every row of every file, in order."""
    import pyarrow as pa
    for fi, path in enumerate(files):
        pf = open_parquet(path, column)
        row = 0
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=[column]):
                col = batch.column(0)
                if pa.types.is_dictionary(col.type):
                    col = col.dictionary_decode()
                if col.null_count:
                    bad = row + next(i for i, v in enumerate(col.is_null().to_pylist()) if v)
                    raise UserError(f"{path}: row {bad}: the text is null")
                binary = pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)
                for v in col.to_pylist() if binary else _strings(col, path, row):
                    if binary:
                        try:
                            v = v.decode("utf-8")
                        except UnicodeDecodeError as e:
                            raise UserError(f"{path}: row {row}: not valid UTF-8 at byte {e.start} of the text")
                    yield fi, row, v
                    row += 1
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            raise UserError(f"{path}: cannot read row {row} on: {e}")


def _strings(col, path, row0):
    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        # Find the row for the message.
        for i in range(len(col)):
            try:
                col[i].as_py()
            except UnicodeDecodeError as e:
                raise UserError(f"{path}: row {row0 + i}: not valid UTF-8 at byte {e.start} of the text")
        raise


def count_rows(files, column):
    counts = []
    for path in files:
        counts.append(open_parquet(path, column).metadata.num_rows)
    return counts


# ---------------------------------------------------------------------------------------------

def convert(tokenizer, inputs, out, column="text", val_fraction=0.01, seed=0, shard_tokens=100000000, threads=0,
            batch_rows=1024, force=False, quiet=False, command=""):
    """Runs the conversion; returns index.json's contents."""
    if not inputs:
        raise UserError("give at least one --input file")
    if not (1 <= shard_tokens <= MAX_SHARD_TOKENS):
        raise UserError(f"--shard-tokens {shard_tokens}: expected 1..{MAX_SHARD_TOKENS} (a shard is assembled in memory)")
    if not (0.0 <= val_fraction <= 0.5):
        raise UserError(f"--val-fraction {val_fraction}: expected 0..0.5")
    if not (0 <= seed < 1 << 64):
        raise UserError(f"--seed {seed}: expected 0..2^64-1")
    if batch_rows < 1:
        raise UserError(f"--batch-rows {batch_rows}: expected at least 1")
    if threads < 0:
        raise UserError(f"--threads {threads}: expected 0 (all cores) or more")
    sp, model_bytes = load_tokenizer(tokenizer)
    vocab, bos, eos = sp.get_piece_size(), sp.bos_id(), sp.eos_id()
    sha = hashlib.sha256(model_bytes)
    per_file = count_rows(inputs, column)
    n_docs = sum(per_file)
    if n_docs == 0:
        raise UserError("the inputs hold no document")
    val = set(int(i) for i in validation_documents(n_docs, val_fraction, seed))

    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out}: exists and is not a directory (--out DIR)")
    index_file = os.path.join(out, "index.json")
    if os.path.exists(index_file) and not force:
        raise UserError(f"{out}: holds a tokenized corpus already (index.json); pass --force to replace it")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {out}: {e.strerror or e}")
    # The index goes first and comes back last: a directory without one is never read as data.
    if os.path.exists(index_file):
        os.unlink(index_file)

    t0 = time.monotonic()
    train = ShardWriter(out, "train", shard_tokens, vocab, sha.digest(), quiet)
    valw = ShardWriter(out, "val", shard_tokens, vocab, sha.digest(), quiet)
    nthreads = threads if threads > 0 else (os.cpu_count() or 1)
    doc_index, empty, text_bytes = 0, 0, 0
    last_report = t0
    pending = []

    def flush_pending():
        nonlocal doc_index, empty, text_bytes
        texts = [t for _, _, t in pending]
        encoded = sp.encode(texts, num_threads=nthreads) if texts else []
        for (fi, row, text), ids in zip(pending, encoded):
            if doc_index >= n_docs:
                raise UserError(f"{inputs[fi]}: the inputs hold more rows than their metadata says")
            is_val = doc_index in val
            doc_index += 1
            text_bytes += len(text.encode("utf-8"))
            if not text:
                empty += 1
                continue
            toks = ([bos] if bos >= 0 else []) + list(ids) + [eos]
            (valw if is_val else train).add_document(toks)
        pending.clear()

    for item in documents(inputs, column, batch_rows):
        pending.append(item)
        if len(pending) >= batch_rows:
            flush_pending()
            now = time.monotonic()
            if not quiet and now - last_report > 10:
                last_report = now
                print(f"parquet_to_shards: {doc_index} of {n_docs} documents, {now - t0:.1f} s", file=sys.stderr)
    flush_pending()
    if doc_index != n_docs:
        raise UserError(f"{inputs[-1]}: the inputs hold {doc_index} rows, their metadata {n_docs}")
    train.finish()
    valw.finish()
    if not train.files:
        raise UserError("the training split has no tokens (every training document is empty)")

    keep = set(train.files) | set(valw.files)
    for name in os.listdir(out):
        if is_shard_name(name) and name not in keep:
            try:
                os.unlink(os.path.join(out, name))
            except OSError:
                pass

    import pyarrow
    import sentencepiece
    splits = {"train": train.summary()}
    if valw.files:
        splits["val"] = valw.summary()
    index = {
        "format": "lrnn token shards",
        "format_version": VERSION,
        "created_by": f"tools/parquet_to_shards.py (pyarrow {pyarrow.__version__}, sentencepiece {sentencepiece.__version__})",
        "command": command,
        "tokenizer": {"path": tokenizer, "sha256": sha.hexdigest(), "vocab_size": vocab, "bos_id": bos, "eos_id": eos,
                      "pad_id": sp.pad_id(), "unk_id": sp.unk_id()},
        "token_bytes": token_bytes_for(vocab),
        "document_layout": "BOS tokens EOS" if bos >= 0 else "tokens EOS",
        "text_unit": "parquet-row",
        "parquet_column": column,
        "inputs": [{"path": p, "documents": c} for p, c in zip(inputs, per_file)],
        "documents": n_docs,
        "empty_documents": empty,
        "text_bytes": text_bytes,
        "val_fraction": val_fraction,
        "val_documents": len(val),
        "seed": seed,
        "shard_tokens": shard_tokens,
        "splits": splits,
    }
    write_file_atomic(index_file, (json.dumps(index, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())
    if not quiet:
        print(f"parquet_to_shards: {n_docs} documents ({len(val)} validation, {empty} empty), {train.tokens} + "
              f"{valw.tokens} tokens in {time.monotonic() - t0:.1f} s -> {index_file}", file=sys.stderr)
    return index


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="SentencePiece .model file")
    ap.add_argument("--input", required=True, nargs="+", help="Parquet files")
    ap.add_argument("--out", required=True, help="directory for the shards and index.json")
    ap.add_argument("--column", default="text", help="the text column (default: text)")
    ap.add_argument("--val-fraction", type=float, default=0.01, help="share of documents held out (default 0.01)")
    ap.add_argument("--seed", type=int, default=0, help="picks the validation documents (default 0)")
    ap.add_argument("--shard-tokens", type=int, default=100000000, help="tokens per shard file (default 1e8)")
    ap.add_argument("--threads", type=int, default=0, help="SentencePiece threads (0 = all cores; the output is the same)")
    ap.add_argument("--batch-rows", type=int, default=1024, help="rows read and encoded at once (default 1024)")
    ap.add_argument("--force", action="store_true", help="replace the tokenized corpus in --out")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        idx = convert(a.tokenizer, a.input, a.out, a.column, a.val_fraction, a.seed, a.shard_tokens, a.threads,
                      a.batch_rows, a.force, a.quiet, command=" ".join(["tools/parquet_to_shards.py", *argv]))
    except UserError as e:
        print(f"parquet_to_shards: error: {e}", file=sys.stderr)
        return 2
    out = {"out": a.out, "documents": idx["documents"], "train_tokens": idx["splits"]["train"]["tokens"]}
    if "val" in idx["splits"]:
        out["val_tokens"] = idx["splits"]["val"]["tokens"]
    print(json.dumps(out, separators=(",", ":"), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
