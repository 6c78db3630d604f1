// Batched gradient accumulation into one flat fp32 DDP bucket (see src/accumulate.rs).
//
// One launch handles up to G4FT_DDP_MAX_ENTRIES gradients: blockIdx.y picks the table entry,
// blocks along x stride over its elements. Entry e does bucket[off + i] = src[i] (overwrite, the
// first report of a parameter in an accumulation window) or bucket[off + i] += src[i].
// The table is passed by value as a kernel parameter (no upload, no allocation); its layout must
// match `Entry` / `Table` in src/accumulate.rs.

#define G4FT_DDP_MAX_ENTRIES 32

struct Entry {
    unsigned long long src;       // device address of a contiguous f32 gradient
    unsigned long long off;       // element offset in the bucket
    unsigned long long len;       // elements
    unsigned long long overwrite; // 1: bucket = src, 0: bucket += src
};

struct Table {
    unsigned long long n; // used entries
    Entry e[G4FT_DDP_MAX_ENTRIES];
};

extern "C" __global__ void ddp_accumulate_f32(float* __restrict__ bucket, const Table t) {
    const unsigned long long k = blockIdx.y;
    if (k >= t.n) {
        return;
    }
    const float* __restrict__ src = reinterpret_cast<const float*>(t.e[k].src);
    float* __restrict__ dst = bucket + t.e[k].off;
    const unsigned long long len = t.e[k].len;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t.e[k].overwrite) {
        for (; i < len; i += stride) {
            dst[i] = src[i];
        }
    } else {
        for (; i < len; i += stride) {
            dst[i] += src[i];
        }
    }
}
