// TransportCommunicator::CompressedRingAllReduce: the ring all-reduce with chunks moved encoded
// by a gradient codec (decode, add in f32, re-encode at each hop).
#include <algorithm>

#include "collectives/reduce.h"
#include "communicator/transport_communicator.h"

namespace cortado::dist::internal {

// The ring of RingAllReduce with encoded chunks (see Communicator::AllReduceCompressed). Every
// (segment, chunk) has a fixed slot of `stride` bytes in two encoded copies of the vector:
// `mine` holds what this rank encodes (each element exactly once: its partial sum on the way
// round, or the final value of the segment it completes), `gathered` what the all-gather
// brings in, forwarded as received (never re-encoded, so every rank decodes the same bytes).
// Chunks are a multiple of 8 elements, so each starts on a whole group of the packed formats.
void TransportCommunicator::CompressedRingAllReduce(float* data, size_t count,
                                                    const Compression& compression, uint64_t seq,
                                                    Deadline deadline) {
  const int n = size_, r = rank_;
  const CodecKind codec = compression.codec;
  Segments seg{count, n};
  const size_t max_seg = seg.Size(0);
  const size_t chunk = ChunkElems(max_seg, sizeof(float));
  const int nchunks = static_cast<int>(std::max<size_t>(1, (max_seg + chunk - 1) / chunk));
  const int window = RecvWindow();
  const size_t stride = (EncodedBytes(codec, chunk) + 63) / 64 * 64;
  const size_t slots = static_cast<size_t>(n) * static_cast<size_t>(nchunks);
  char* base = Scratch((static_cast<size_t>(window) + 2 * slots) * stride);
  char* recv_slots = base;
  char* mine = base + static_cast<size_t>(window) * stride;
  char* gathered = mine + slots * stride;
  auto slot_of = [&](char* copy, int x, int c) {
    return copy + (static_cast<size_t>(x) * nchunks + static_cast<size_t>(c)) * stride;
  };
  auto range = [&](int x, int c, size_t* lo, size_t* len) {
    size_t sz = seg.Size(x);
    size_t a = std::min(static_cast<size_t>(c) * chunk, sz);
    *lo = seg.Offset(x) + a;
    *len = std::min(chunk, sz - a);
  };
  auto send_seg = [&](int t) { return t < n - 1 ? Mod(r - t, n) : Mod(r + 1 - (t - (n - 1)), n); };
  auto recv_seg = [&](int t) { return t < n - 1 ? Mod(r - t - 1, n) : Mod(r - (t - (n - 1)), n); };
  // Encodes elements [lo, lo + len) of data into dst as ring step t's encoding site.
  auto encode = [&](int t, size_t lo, size_t len, char* dst) {
    EncodeOptions options;
    options.rounding = compression.rounding;
    options.seed = HopSeed(compression.seed, r, t);
    options.first_index = lo;
    Encode(codec, data + lo, len, dst, options,
           compression.residual == nullptr ? nullptr : compression.residual + lo);
  };
  RingPipeline(
      seq, deadline, 2 * (n - 1), nchunks, Mod(r + 1, n), Mod(r - 1, n),
      [&](int t, int c) {
        const int x = send_seg(t);
        size_t lo, len;
        range(x, c, &lo, &len);
        char* p;
        if (t < n - 1) {
          // Reduce-scatter: this rank's partial sum of the chunk (its own value at step 0).
          p = slot_of(mine, x, c);
          encode(t, lo, len, p);
        } else {
          // All-gather: the completed chunk (encoded by this rank at step n-2), or one received.
          p = slot_of(t == n - 1 ? mine : gathered, x, c);
        }
        return ScratchSpan(p, EncodedBytes(codec, len));
      },
      [&](int t, int c, int slot) {
        size_t lo, len;
        range(recv_seg(t), c, &lo, &len);
        char* p = t < n - 1 ? recv_slots + static_cast<size_t>(slot) * stride
                            : slot_of(gathered, recv_seg(t), c);
        return ScratchSpan(p, EncodedBytes(codec, len));
      },
      [&](int t, int c, int slot, auto&&) {
        const int x = recv_seg(t);
        size_t lo, len;
        range(x, c, &lo, &len);
        if (t >= n - 1) {
          Decode(codec, slot_of(gathered, x, c), len, data + lo);
          return;
        }
        DecodeAccumulate(codec, recv_slots + static_cast<size_t>(slot) * stride, len, data + lo);
        if (t == n - 2) {
          // This rank completed the chunk: encode it once, and keep what the others will get.
          char* p = slot_of(mine, x, c);
          encode(t, lo, len, p);
          Decode(codec, p, len, data + lo);
        }
      });
}

}  // namespace cortado::dist::internal
