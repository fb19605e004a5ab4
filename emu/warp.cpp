// Warp collectives of the SIMT emulation (DESIGN: CUDA: the SIMT emulation): the lanes of a mask
// meet; each deposits its operands and parks; the lane that completes the mask computes every
// lane's result. Lanes that meet must agree on the collective, its mask and its call site, else
// the block fails with both sites named. mma.m16n8k16 and ldmatrix follow the PTX ISA fragment
// tables (lane l, g = l >> 2, t = l & 3; a 32-bit register holds two 16-bit elements, the lower
// index in the low half).
#include <string>

#include "emu/counters.h"
#include "emu/emu_internal.h"

namespace ra_emu {

namespace {

const char *name(Collective c)
{
    switch (c) {
    case Collective::shfl_idx: return "__shfl_sync";
    case Collective::shfl_up: return "__shfl_up_sync";
    case Collective::shfl_down: return "__shfl_down_sync";
    case Collective::shfl_xor: return "__shfl_xor_sync";
    case Collective::vote_any: return "__any_sync";
    case Collective::vote_all: return "__all_sync";
    case Collective::ballot: return "__ballot_sync";
    case Collective::syncwarp: return "__syncwarp";
    case Collective::mma_bf16: return "mma.m16n8k16.bf16";
    case Collective::mma_f16: return "mma.m16n8k16.f16";
    case Collective::ldmatrix_x4: return "ldmatrix.x4";
    case Collective::ldmatrix_x4_trans: return "ldmatrix.x4.trans";
    }
    return "?";
}

float bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

float f16_to_float(uint16_t h)
{
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    uint32_t u;
    if (e == 31) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else { // subnormal: m * 2^-24
        float f = (float)m * 5.9604644775390625e-8f;
        std::memcpy(&u, &f, 4);
        u |= s;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

float half_of(uint32_t reg, int hi, bool bf16)
{
    const uint16_t h = (uint16_t)(hi ? reg >> 16 : reg & 0xffff);
    return bf16 ? bf16_to_float(h) : f16_to_float(h);
}

// D = C + A B, A 16x16 (row), B 16x8 (col), f32 accumulate: exact products summed in float64,
// rounded once to float32.
void mma(const Pending &p, bool bf16, uint32_t out[32][8])
{
    double A[16][16], B[16][8], C[16][8];
    // useful: neither operand all zero (a padding row or column, or P of a masked tile)
    bool a_nonzero = false, b_nonzero = false;
    for (int l = 0; l < 32; ++l) {
        a_nonzero = a_nonzero || (p.in[l][0] | p.in[l][1] | p.in[l][2] | p.in[l][3]) & 0x7fff7fffu;
        b_nonzero = b_nonzero || (p.in[l][4] | p.in[l][5]) & 0x7fff7fffu;
    }
    count_mma(a_nonzero && b_nonzero);
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        const uint32_t *a = p.in[l], *b = p.in[l] + 4, *c = p.in[l] + 6;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = half_of(a[0], h, bf16);
            A[g + 8][2 * t + h] = half_of(a[1], h, bf16);
            A[g][2 * t + 8 + h] = half_of(a[2], h, bf16);
            A[g + 8][2 * t + 8 + h] = half_of(a[3], h, bf16);
            B[2 * t + h][g] = half_of(b[0], h, bf16);
            B[2 * t + 8 + h][g] = half_of(b[1], h, bf16);
            float f0, f1;
            std::memcpy(&f0, &c[h], 4);
            std::memcpy(&f1, &c[2 + h], 4);
            C[g][2 * t + h] = f0;
            C[g + 8][2 * t + h] = f1;
        }
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int r = 0; r < 4; ++r) {
            const int row = g + (r >= 2 ? 8 : 0), col = 2 * t + (r & 1);
            double d = C[row][col];
            for (int k = 0; k < 16; ++k) d += A[row][k] * B[k][col];
            const float f = (float)d;
            std::memcpy(&out[l][r], &f, 4);
        }
    }
}

// Four 8x8 matrices of 16-bit elements; lane l gives row l & 7 of matrix l >> 3.
void ldmatrix(const Pending &p, bool trans, uint32_t out[32][8])
{
    const Block &b = block();
    uint16_t M[4][8][8];
    uintptr_t rows[32];
    for (int l = 0; l < 32; ++l) {
        uintptr_t addr;
        std::memcpy(&addr, p.in[l], sizeof addr);
        const uintptr_t lo = (uintptr_t)b.smem, hi = lo + b.smem_bytes;
        if (addr % 16)
            fail_block(std::string(name(p.op)) + " at " + site_str(p.site) + ": lane " +
                       std::to_string(l) + "'s row address is not 16-byte aligned");
        if (addr < lo || addr + 16 > hi)
            fail_block(std::string(name(p.op)) + " at " + site_str(p.site) + ": lane " +
                       std::to_string(l) + "'s row is not in the block's dynamic shared memory");
        std::memcpy(M[l >> 3][l & 7], (const void *)addr, 16);
        rows[l] = addr;
    }
    count_ldmatrix(rows, trans);
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; ++i) {
            const uint16_t lo = trans ? M[i][2 * t][g] : M[i][g][2 * t];
            const uint16_t hi = trans ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
            out[l][i] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
    }
}

// Which lane a shuffle reads (its own when the source is outside its width segment).
int shuffle_source(Collective op, int lane, int arg, int width)
{
    const int base = lane & ~(width - 1), in_seg = lane - base;
    switch (op) {
    case Collective::shfl_idx: return base + (arg & (width - 1));
    case Collective::shfl_up: return in_seg >= arg ? lane - arg : lane;
    case Collective::shfl_down: return in_seg + arg < width ? lane + arg : lane;
    default: { // xor
        const int src = lane ^ arg;
        return src < base + width ? src : lane;
    }
    }
}

void compute(const Pending &p, uint32_t out[32][8])
{
    switch (p.op) {
    case Collective::mma_bf16: return mma(p, true, out);
    case Collective::mma_f16: return mma(p, false, out);
    case Collective::ldmatrix_x4: return ldmatrix(p, false, out);
    case Collective::ldmatrix_x4_trans: return ldmatrix(p, true, out);
    case Collective::syncwarp: return;
    case Collective::vote_any: case Collective::vote_all: case Collective::ballot: {
        uint32_t ballot = 0;
        for (int l = 0; l < 32; ++l)
            if ((p.mask >> l & 1) && p.in[l][0]) ballot |= 1u << l;
        const uint32_t r = p.op == Collective::ballot ? ballot
                           : p.op == Collective::vote_any ? ballot != 0
                                                          : ballot == p.mask;
        for (int l = 0; l < 32; ++l) out[l][0] = r;
        return;
    }
    default:
        for (int l = 0; l < 32; ++l) {
            if (!(p.mask >> l & 1)) continue;
            const int width = (int)p.in[l][3], arg = (int)p.in[l][2];
            if (width < 1 || width > 32 || (width & (width - 1)))
                fail_block(std::string(name(p.op)) + " at " + site_str(p.site) +
                           ": width " + std::to_string(width) + ", expected a power of 2 <= 32");
            const int src = shuffle_source(p.op, l, arg, width);
            if (!(p.mask >> src & 1))
                fail_block(std::string(name(p.op)) + " at " + site_str(p.site) + ": lane " +
                           std::to_string(l) + " reads lane " + std::to_string(src) +
                           ", which is not in the mask");
            out[l][0] = p.in[src][0];
            out[l][1] = p.in[src][1];
        }
    }
}

} // namespace

void warp_collective(Collective op, unsigned mask, const uint32_t *in, int nin, uint32_t *out,
                     int nout, Site s)
{
    Block &b = block();
    Thread *t = b.current;
    const int lane = t->tid % 32, w = t->tid / 32;
    auto here = [&] { return std::string(name(op)) + " at " + site_str(s); };
    if (!(mask >> lane & 1))
        fail_block(here() + ": lane " + std::to_string(lane) + " is not in its mask");
    const int lanes_in_warp = b.nthreads - w * 32 < 32 ? b.nthreads - w * 32 : 32;
    if (lanes_in_warp < 32 && (mask >> lanes_in_warp))
        fail_block(here() + ": the mask names lanes past the block's last thread");
    std::vector<Pending> &pend = b.warps[(size_t)w];
    Pending *p = nullptr;
    for (Pending &q : pend)
        if (q.mask >> lane & 1) p = &q;
    if (p && (p->op != op || p->mask != mask || site_str(p->site) != site_str(s)))
        fail_block("divergent warp collective: lane " + std::to_string(lane) + " at " + here() +
                   " (mask " + std::to_string(mask) + "), lanes of its warp wait at " +
                   name(p->op) + " at " + site_str(p->site) + " (mask " +
                   std::to_string(p->mask) + ")");
    if (!p) {
        pend.push_back(Pending{op, mask, 0, 0, s, {}});
        p = &pend.back();
    }
    for (int i = 0; i < nin; ++i) p->in[lane][i] = in[i];
    p->arrived |= 1u << lane;
    if (p->arrived != p->mask) {
        park(State::at_warp, s);
        for (int i = 0; i < nout; ++i) out[i] = t->out[i];
        return;
    }
    uint32_t res[32][8] = {};
    compute(*p, res);
    if (op <= Collective::shfl_xor) count_shuffle();
    if (mask == 0xffffffffu) counters_flush_warp(b, w); // every lane's earlier requests are made
    for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1)) continue;
        Thread &lt = b.threads[(size_t)(w * 32 + l)];
        std::memcpy(lt.out, res[l], sizeof lt.out);
        if (&lt != t) lt.state = State::runnable;
    }
    pend.erase(pend.begin() + (p - pend.data()));
    for (int i = 0; i < nout; ++i) out[i] = t->out[i];
}

} // namespace ra_emu
