// Tile shapes and split heuristics of the tree-verify kernel, one line per head-dim family.
// TreeVerifyConfig<T, Dqk, Dv, BLOCK_M, BLOCK_N, WARPS_N, STAGES, WGMMA, V_TILE, PAIRED_TILES>: a portable
// mma.sync configuration and an sm_90a wgmma one per family.
//
// Measured on an H200 (bf16, median of CUDA-graph replays, workloads of DESIGN.md, one change at a time) with a
// development timing script: uniformly random parents, draft K/V in the cache, slots drawn from a pool twice the
// need. `python -m kdtree_ops bench` (examples/results) is the reference. The M1 / M2 / M5 columns above the MLA
// section come from a version of the script that moved k_cache and v_cache to the GPU separately, so V was not
// a view of K and every tile took the V-reload path (about twice the benchmark's time); the MLA section is
// measured with V a view of K, as the benchmark and SGLang's pool have it.
// Portable mma.sync kernel (G1 / G2 / M1 / M2 in us):
//   first version (a kv_indices read per 16-byte chunk, inline)         136 / 652 / 253 / 1079
//   key sources staged in shared memory one tile ahead                   125 / 525 / 241 /  915
//   merge with all loads of a piece in flight; scale/mask/tanh as
//     uniform-branch loops (the per-element branches had made the hot
//     loop ~2,000 SASS instructions)                                       56 / 325 / 145 /  752
//   pieces aligned across the row tiles of a request (ncu on G2 before:
//     L2 hit rate 4.7 %, every row tile re-read K/V from DRAM) and
//     sized by each request's share of the grid                           53 / 280 / 134 /  732
// sm_90a wgmma kernel (G1 / G2 / G4 / G5 / M1 / M2 / M5 in us):
//   wgmma GEMMs, same loop as the portable kernel                 42 / 159 / 160 / 154 / 138 / 685 / 1273
//   K/V row pointers staged instead of slots (the gather had cost
//     ~37 SASS instructions per 16-byte copy), exp2 as one MUFU with
//     the scale in its FMA, MLA tiles of 64 keys without V tiles          38 / 132 / 134 / 124 / 122 / 547 / 987
//   descriptors stepped by constants in uniform registers (the S GEMM
//     had cost 524 instructions per tile for 36 HGMMA), O rescaled only
//     when a row maximum moved                                            37 / 127 / 127 / 117 / 118 / 511 / 916
//   narrow configuration for short trees (G4: 16 tokens x 4 heads
//     filled half of a 128-row tile; 64-row tiles took 159 -> 103 us)
//     and 8 threads per K/V row in the gather (full 128-byte lines,
//     one pointer read per row per thread)                                36 / 121 /  93 / 111 / 110 / 440 / 765
//   tried: 64-row tiles for every GQA shape (two CTAs per SM): G2 163 us; 128 x 64 tiles, 3 stages: G2 184 us.
//   GQA (Dv <= 128): PV GEMM of tile kt - 1 in flight during the
//     softmax of tile kt, K leading V by a tile (run_tiles_overlapped);
//     a reference maximum that moves only by more than 2^8; the merge
//     with four pieces' loads in flight                                   36 / 106 /  89 / 104 /  99 / 428 /   -
//   tried: the overlapped loop with 64-key tiles: G2 126 us; without the barrier that keeps the softmax before
//   the PV wait (ptxas then waits first): G2 108 us.
//   GQA (Dv <= 128), warp-specialized: one more warpgroup gathers K
//     and V (its two halves on their own), mbarrier-tracked buffers
//     instead of a CTA barrier per tile, setmaxnreg 40 / 232; K's
//     buffer handed back right after its S GEMM; the two math
//     warpgroups take turns issuing their GEMMs (MLA unchanged)           33 / 105 /  84 /  99 /   - /   - /   -
//   tried: 64-key tiles with 4 (3) stages of K and V: G2 113 (111), G4 107 (106) us; an L2 prefetch of the
//   next tile's rows: no gain. Without the turns: G2 107, G5 103 us.
// MLA, wgmma (M1 / M2 / M3 / M4 / M5 in us). Earlier development-script MLA figures had copied V apart from K
// on the device, which takes the V-reload path: about twice these.
//   key split (two warpgroups split S's 64 keys, wgmma N = 32; the math warps
//     load the tiles, three CTA barriers per tile)                       74 / 232 / 225 /  96 / 366
//     its loads alone (no GEMMs)                                          55 / 118 / 115 /  69 / 121
//     its math alone (no loads)                                           71 / 201 / 195 /  84 / 334
//   paired tiles (run_tiles_paired: S at wgmma N = 64 per warpgroup, tiles
//     taken in turns, a gathering warpgroup), B's S issued with A's     73 / 209 / 198 /  94 / 313
//   the same with B's S issued after A's PV GEMM (B's copies get longer
//     to land) and mbarrier hand-offs of P (kept: racecheck follows
//     mbarriers; it flagged the first version's bar.arrive hand-offs)    75 / 214 / 204 /  95 / 328
//     its math alone (the gatherers copy nothing)                        70 / 174 / 170 /  77 / 279
//   tried: B's S issued with A's again, with the mbarrier hand-offs: 76 / 212 / 205 / 96 / 326, the same as kept
//   (the first version's lead came with its bar.arrive hand-offs).
// So the paired kernel is bound by its math first (S at N = 64 reads 128 bytes of shared memory per
// tensor-core cycle, the limit), then by the copies of a pair's tiles, which begin only when the previous pair
// is done with the buffer. Next: halves of the K buffers with barriers of their own (A's first 256 columns go
// back to the copiers right after warpgroup 0's PV GEMM).
// The epilogue (tree_verify_stores.cuh), every kernel. Per-phase clocks of each CTA (clock64 stamps in a
// development build) showed the kernels spending 5-7 us before the first tile (schedule, Q) and, at the end,
// 12 us storing MLA M1's fp32 partials straight from the fragments, 22 us for one CTA to merge a row tile's
// eight pieces (1 MB), 9 us storing M5's bf16 output. Development script, us (G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//   before (fragment stores; the last CTA merges; timed
//     in the per-phase clock build, same loop)          34 107 114  86 101 /  76 216 211  97 331
//   O staged in shared memory, 16-byte row stores; the
//     partial published in 4 row slices with a counter
//     each, whoever completes a slice merges it           30 106 113  81 103 /  55 194 204  90 320
//   partials in T (their log-sum-exps in fp32); the merging
//     CTA adds its own piece from the staged copy         29 105 113  81  98 /  53 191 196  82 323
//   the merge branch-free (it was bound by instruction
//     latency, ncu: no memory stall dominated); the
//     schedule in two block scans instead of three        27 106 112  79 100 /  53 188 191  80 320
//   tried: the merge's loads in registers, 16 in flight per thread (ptxas spilled 2 KB, in the tile loop too);
//   a fresh pipeline per slice instead of one stream over the slices: the same time.
//   The MLA Q tile lands 7-10 us into a segment (per-phase clocks; 72 KB while the copiers fetch two 72 KB
//   tiles). tried: the odd copier group's first copies waiting for tile A: the same times.
//   Per-phase clocks later (us, median over CTAs of the first segment; M2 / M1 / G2):
//     schedule (two scans) 2.6 / 2.5 / 2.7, then to the segment 2.4 / 2.0 / 2.6, Q landed 5.5 / 5.1 / 3.1 after
//     the segment starts (first tile 0.4 later), publishing a split piece's partial 5.4 / 5.0 / 4.8 (4.1 of it
//     the four slices' stores, each followed by its arrival), merging a slice 7.1 / 6.0 / 4.6.
//   tried: the gatherers start a segment's copies only once its Q landed (a named barrier): Q lands no sooner
//   (5.4 / 5.0 / 3.0 us), the first tile later (7.8 / 6.4 / 5.7); G2 91 -> 93, G5 87 -> 90 us.
//   tried: all of a partial's slices stored, then their four arrivals at once (one lane each): the publication
//   takes 2.6 us instead of 4.1 (M2), but the last piece of a row tile then completes every slice and merges
//   all four alone (combine 7.1 -> 24.9 us): M2 160 -> 172, G1 30 -> 37 us. The staggered arrivals are what
//   share the merge out.
//   The merge of a slice ran about 0.6 us per part, each thread adding chunks of four rows (a weight, two exp2
//   and a shared-memory read of the log-sum-exp per chunk). Each thread adding chunks of one row, the weight
//   once per part, consecutive threads on consecutive chunks (whole lines per warp instruction), same run
//   (M1 M2 M3 M4 M5 / G1 G2 G5, us): before 44.7 158.7 160.5 69.8 265.3 / 29.3 90.6 86.8,
//   kept 44.1 156.6 156.6 67.4 264.9 / 28.3 90.8 86.6. (Each thread on consecutive chunks of its row, a warp
//   instruction then spread over 16 lines: M1 45.2 -> 47.2 us.) A ring of eight parts in flight instead of
//   four, in the K/V buffers with O staged in Q's, did not change the time per part.
// What bounds it now. The loads: G3 reads 268 MB from DRAM at about 2.6 TB/s, near its floor. G2 reads 134 MB
// from DRAM but moves 269 MB from L2 to the SMs (its two row tiles per KV head read each K/V tile), G5's eight
// row tiles per head 268 MB, MLA M2 604 MB (sixteen row tiles read each latent tile). Development script, same
// build, us (G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//   the whole kernel                                     29 104 111  80 100 /  48 187 188  78 306
//   the loads alone (no GEMMs; the epilogue runs)        24  88  98  77  79 /  41 117 118  66 178
//   the same, the gatherers' copies signalled by
//     cp.async.mbarrier.arrive instead of waited for     25  88  97  77  78 /  43 117 118  65 177
//   the same without the gatherers' proxy fence          24  89  98  77  80 /  43 117 117  66 176
//   (earlier: the math alone, gatherers copying nothing: G 32 78 75 49 73, M2 174. Neither more stages in
//   flight (above) nor sorted slots, G2's loads alone 88.4 against 88.9 us, changed the loads.)
// The L2-to-SM path is not what bounds the loads: examples/gather_probe.cu (a GPU suite stage) gathers G2's
// and M2's tiles in the kernel's pattern (its pieces, 16-byte cp.async through slots, two groups of 64 threads,
// one tile in flight each) with nothing else running: G2's in 53.8 us (39 GB/s per SM, about the DRAM rate for
// its 134 MB), M2's in 42.8 us (110 GB/s per SM, mostly from L2), against 88 and 117 us above. Neither the wait
// nor the fence per tile costs the rate (rows 3 and 4; the full kernel with the arrive-on-copies signalling:
// the same times as kept). Where the time goes, from per-CTA clocks of the first segment (a development build
// with clock64 around each wait; us, median over CTAs, full kernel):
//                        K / even-tile copier          V / odd-tile copier    math warps    tiles phase
//                        waits for a   issues copies   waits for a            wait for
//                        free buffer   (and the next   free buffer            landed tiles
//                                      tile's slots)
//   G2 (33 tiles)            3.5           73.6            26.6                  25.2           88.2
//   G5 (33 tiles)            3.4           68.9            24.1                  20.1           83.0
//   M2 (65 tiles)           89.4           68.3            97.1                  25.5          166.6
//   M5 (129 tiles)         173.7          117.3           177.4                  35.5          302.1
//   (the copiers' waits for their copies to land add up to 1-8 us per CTA; SM clock 1.70-1.76 GHz here.)
// GQA: the K copier issues copies for 83 % of the tiles phase, about 15 GB/s, where a group of the probe moves
// 20 GB/s; the V copier waits for its buffers (they go back a tile late: the PV GEMM of tile t runs in iteration
// t + 1). So the loads bound G2 and G5, at three quarters of the probe's rate and behind the DRAM floor.
// MLA: the math warps wait for tiles 15 % (M2) and 12 % (M5) of the time; the copiers wait for free buffers
// half of it. So the math bounds MLA: the math warps are busy about 2.2 us per 64-key tile (M2) where its
// 8.9 MFLOP take 1.6 us at the matmul rate the suite measures per SM (718 TFLOP/s / 132). (Its loads alone,
// 117 us against the probe's 43, still run the hand-off: one 72 KB buffer per copier group, released when both
// warpgroups are done with it.)
// The copier's issue rate (development script, same run, us, G1 G2 G3 G4 G5):
//   each staged row pointer read right before its row's copies
//     (the SASS waited on the shared-memory load 16 times a tile)   27 103 109  80  99
//   pointers read in batches of four before their copies           28  92 106  80  86
//   batches of eight (kept)                                        29  91 105  81  86
//   all sixteen of a tile at once (registers)                      29  98 108  81  88
//   setmaxnreg 48 for the gatherers does not fit: the launch gives 168 registers a thread, 64512 a CTA, exactly
//   256 x 232 + 128 x 40, so the math warps' claim of 232 never returns (the kernel hangs).
//   Later: the gatherers keep 56 registers and the math warps 224 (256 x 224 + 128 x 56 = 64512; the narrow
//   tiles' 128 math threads 200). At 40, ptxas had spilled in the copy loops (9 and 7 local loads per tile in
//   the wide kernel's K and V loops, 3 each in the narrow one's); at 56 they spill nothing and are 16
//   instructions shorter, and the math loops keep their length with no spills (MLA's too). Same run, us, three
//   repetitions' means (G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//     40 / 232    23.3 86.2 100.4 78.8 83.1 / 38.3 143.3 140.2 56.1 249.0
//     56 / 224    23.1 81.0  95.1 75.8 76.1 / 37.8 142.7 140.7 56.2 248.5   (kept)
//   Another run:
//     56 / 224    23.8 81.4  94.5 74.6 76.1 / 38.5 141.4 140.0 56.3 248.6
//     64 / 216    24.3 81.8  94.6 75.8 78.4 / 39.3 146.2 144.6 57.8 254.7
//     72 / 216, each copier finding a tile's 16 row sources at once (at 56 registers that spilled)
//                 24.4 82.9  93.5 75.3 79.2 / 39.5 146.2 144.7 57.9 255.4
//   The math warps need their 224: at 216 MLA runs 4-7 us slower (M2, M3, M5) and G5 2 us.
//   tried after: a third V buffer (a V buffer is held a tile longer than a K buffer; the zero tile shrunk to one
//   64-column block read as every block, descriptor block stride 0, to make room). GPU suite, G1-G5:
//   31.7 / 90.7 / 104.5 / 82.0 / 86.4 us against 30.0 / 91.5 / 103.8 / 81.1 / 87.2 without; not kept.
// MLA, tried: K tiles landing in 64-column blocks with a full barrier each (cp.async.mbarrier.arrive.noinc, the
// S GEMM issued block by block as they land) and warpgroup 1 handing A back before its S of B. M1 M2 M3 M4 M5:
// 47 184 186 76 306 before, 52 192 180 79 304 with it; not kept.
// MLA, one stream of copies (produce with paired tiles): all 128 gatherers copy each tile, in the order the
// buffers come back, and arrive on its full barrier when their copies land (cp.async.mbarrier.arrive.noinc; the
// math warps fence after the wait), where two groups of 64 each filled one buffer and waited for their copies.
// Development script, same run (us, M1 M2 M3 M4 M5 / G1 G2 G3 G4 G5):
//   two groups of 64                                       50 183 189  77 306 / 30  90 105  80  86
//   one stream of 128, GQA too (K then V of each tile)     46 160 159  69 266 / 29  99 105  81  95
//   kept: the stream for MLA, GQA's two groups (next run)  44 161 161  70 265 / 30  91 105  79  87
//   M2's math alone (the gatherers copy nothing): 151, so the copies now cost about 10 us of M2's 161.
//   later, the stream's gatherers waiting for their own copies, fencing and arriving, as GQA's copiers do (one
//   landed signal and one producer loop for both kernels), same run, three repetitions' means (M1 M2 M3 M4 M5):
//   39.1 146.6 140.8 56.6 249.1 on cp.async.mbarrier.arrive, 39.4 146.0 140.1 57.0 246.6 waiting (kept).
// MLA, tried: FlashMLA's seesaw schedule in run_tiles_paired (warpgroup 0's softmax of A runs during S of B;
// warpgroup 1's softmax of B against A's maxima during warpgroup 0's P V of A from registers; P_A moved to B's
// maxima before it is shared, so warpgroup 1 issues both of its PV GEMMs with no rescale between; each S issued
// at the end of the previous pair). Its math alone is faster (M2 151 -> 143, M3 149 -> 138, M5 259 -> 231 us),
// but it keeps each buffer busy until late in the pair, so the copies bound it (M1 M2 M3 M4 M5, same runs):
//   halves of each buffer handed back and refilled apart (V of warpgroup 0 / the rest), two groups of 64:
//                                                          61 203 201  89 330  (against 52 184 189  78 304)
//   the same, one stream of 128 over the halves             54 197 207  88 332
//   whole buffers, one stream of 128                        51 211 215  89 338  (against 44 161 161  70 265)
// MLA, tried: warpgroup 1 issues S of B before it multiplies A's P (S of B runs during warpgroup 0's softmax
// of A; ptxas waits for S of B before warpgroup 1 rescales O, C7517), same runs: M1-M5 46.7 / 163.9 / 165.2 /
// 71.3 / 257.4 against 49.2 / 161.4 / 162.3 / 70.6 / 266.7 us. B must have landed when the pair starts, and its
// buffer is the last one freed, so only M5 (128 row tiles reading each tile: L2 hits) gains. Not kept.
// MLA and GQA, tried: the gatherers ask L2 for the rows of the tile two ahead (cp.async.bulk.prefetch.L2, a
// row each): G2 91 -> 153, G5 87 -> 150, M2 160 -> 182, M5 267 -> 307 us.
// MLA, tried after: each warpgroup multiplies its own tile's P from registers (wgmma with A in registers, issued
// right after the probabilities; P stored for the other warpgroup while the tensor cores work): M1-M5 49 180 174
// 74 292 against 48 160 161 70 266 us in the same runs; ptxas spilled about 20 registers around that issue.
// The fixed costs of a call. Code that runs once per segment runs from a cold instruction cache, so its length
// is its time: load_q divided by the group for every 16-byte chunk (about 1800 SASS instructions for MLA's Q,
// which landed 5.5 us after the segment start, 3.1 us for GQA's); copy_rows with one division per row (about
// 400) and store_output likewise, then the merge copying each part's log-sum-exps with the part, then the
// counters zeroed by a kernel that the verify kernel overlaps instead of a memset node. Development script,
// same runs, us:                                   G1    G2    G3    G4    G5    M1    M2    M3    M4    M5
//   before                                       30.3  89.8 104.4  80.7  86.5  45.6 156.9 156.1  67.3 264.4
//   rows + log-sum-exps with the parts           26.4  88.2 102.1  80.1  85.9  40.7 149.1 151.2  62.8 256.1
//   + the overlapped zeroing kernel (kept)       26.1  87.7 101.1  79.2  84.6  38.2 147.1 149.7  61.4 255.1
//   (the memset node alone, timed by leaving it out: 1.2 to 2.8 us a call.)
//   tried after: a split piece publishes its slices in as many rounds as the row tile has pieces (a round's
//   slices arriving together, a lane each), so two pieces take two rounds of two slices instead of four: G3 -1.1,
//   G5 -1.4, M3 -1.6, M4 -0.8 us, but G1 +0.5, G2 +0.7, M1 +1.0, M5 +1.1 (three repetitions each); not kept.
//   tried after: with at most 32 requests, every warp scans them itself with one barrier (the block-wide scan
//   takes three): whole GPU suite passed, but its benchmark was no faster than the previous suite's (M2 150.5
//   against 148.8 us, in a run whose matmul ceiling read 1 % lower) and no side-by-side run fitted; not kept.
//   tried after: each piece claims its slices first (a counter of claims and one of publications per slice),
//   and the last to claim a slice writes nothing of it but merges it once the others' parts are published, so
//   that the piece finishing last would merge at once. Correct on the CUDA tests; same run, three repetitions'
//   means, G 25.0 83.5 94.9 75.6 78.7 / M 37.5 143.3 141.2 57.6 250.1 before, 27.9 87.7 96.4 75.9 79.6 / 42.1
//   146.7 142.6 57.3 250.8 with it. A row tile's pieces finish together: claiming all slices at once made one
//   piece last on most of them, merging them alone after waiting for the other's stores; not kept.
// The work split, then (development script, three repetitions' means, us, G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//   main                                                  24.7  88.4 101.1  79.2  84.8 / 37.8 148.3 150.7 61.5 256.0
//   each request's cut stored by the scan (no 64-bit division per piece), release-only slice arrivals
//                                                         24.0  87.7 101.4  78.8  83.1 / 37.6 145.3 147.4 60.8 257.0
//   the same, another run                                 24.3  87.7 100.7  78.9  83.9 / 39.0 145.5 147.1 60.7 255.5
//     + piece indices in 32 bits, GQA's P packed in place (right after the PV wait, into the PV operand)
//                                                         23.8  92.4 100.7  78.3  84.3 / 38.8 143.4 140.3 56.3 247.4
//     + the same with 32 bits for the paired MLA kernel only (kept)
//                                                         23.4  86.5 100.6  79.8  83.1 / 39.0 144.3 141.1 56.2 246.8
//   In 32 bits ptxas keeps the piece loop's control and the mbarrier addresses in uniform registers: the
//   paired kernel's math warps (232 registers) then spill nothing (a 64-bit value had spilled, reloaded each
//   piece). In GQA's wide kernel the same freedom turns the tile loop's compares into uniform compares moved
//   into predicates (+18 SASS instructions in the loop), and G2 runs 5 us slower. With P packed apart, as
//   before, ptxas had also used the room to copy 16 registers into the PV operand each tile (G2 93.5 us).
// Per-CTA clocks of the first segment after these changes, us (G1 / G2 / G5 / M1 / M2 / M4): the two scans
// 2.2 / 2.5 / 2.4 / 2.3 / 2.6 / 2.5 (1.1-1.4 each, even for one request), then to the segment 2.3 / 2.4 / 2.5 /
// 1.9 / 2.0 / 2.3, Q landed 1.6 / 1.6 / 1.6 / 1.5 / 1.7 / 2.4 later, the first tile 2.1-3.7 after the segment's
// start, then about 2.0-2.4 a tile; publishing a split piece 4.0 / 4.2 / 4.1 / 5.0 / 5.5 / 4.8 and merging a
// slice 2.8 / 3.5 / 4.5 / 4.5 / 5.4 / 5.6. A graph replay of one call takes 1.3-2.1 us more than the kernel.
// The gatherers, tried after (development script, same run, three repetitions' means, us,
// G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//   main                                                  23.1 81.1 95.1 75.8 75.4 / 37.9 141.8 140.0  56.0 247.4
//   a row's gather source chosen once, not per 16-byte copy (GQA's copy loops 349 -> 285 SASS instructions,
//     MLA's shorter too)                                  23.3 80.5 91.4 75.6 74.4 / 38.7 150.9 146.7  56.4 261.2
//   another run: main                                     23.2 81.1 94.5 74.3 76.0 / 37.7 141.7 140.6  56.2 248.0
//   kv_indices read two tiles ahead, rows formed a tile ahead
//                                                         23.7 84.7 97.8 76.3 79.1 / 37.8 143.9 141.0  56.5 247.6
//   the same, GQA's copiers arriving on their copies (cp.async.mbarrier.arrive, the math warps fencing) instead
//     of waiting for them, so two tiles of each side are in flight
//                                                         23.5 88.2 96.7 76.6 82.6 / 37.9 143.4 141.6  56.7 248.5
//   the same for the K copier only (V as main), two repetitions, against main's 23.2 80.9 95.7 75.8 75.5 / 37.4
//     142.3 140.9 56.3 248.8 in the same run            23.5 87.9 98.0 76.3 83.0 / 38.2 143.6 141.9  57.0 248.9
//   and another run (G1-G5, two repetitions): main 23.2 80.4 95.1 75.6 75.1; the K copier only, as above 23.5 87.4
//   97.4 76.2 80.7; the same with the slots read a tile ahead as on main 23.4 88.6 97.9 76.5 79.8; the K copier
//   only without the math warps' proxy fence after the K wait (racy, timed only) 23.5 87.8 96.9 76.0 80.4. So
//   neither the earlier reads nor the fence cost the time; what is left is the K copier's arrival on its copies
//   (with the slot / row split that these variants share, a cost of its own not measured apart).
//   None kept. Shorter copy loops cost MLA 6-9 % (later kept for GQA, below); reads issued earlier and more copies
//   in flight make G2 and G5 slower, K's copies alone as much as both sides'. ncu's source-level samples of main
//   (G2, G5): the math warps' tile loop holds half of all warp samples (two thirds of the warps are math warps),
//   stalled on fixed-latency dependencies (31-35 % of its samples), the named barriers of the turns and
//   barrier_after (14-18 %) and the wait for a landed tile (8-14 %). The K copier stalls mostly on its read of the
//   next tile's kv_indices (behind the tile's copies), the V copier on a free buffer, then on its copies. The math
//   alone (the gatherers copy nothing, every hand-off kept; timed without the correctness check), another run:
//     main                                                23.1 80.8 95.4 75.6 74.8 / 38.5 142.3 139.5  56.1 246.2
//     the math alone                                      21.6 67.8 65.8 43.2 68.3 / 36.6 146.5 142.0  51.7 256.6
//   So G2 and G5 would meet their targets if the tiles landed in time: the copies add 13 and 6.5 us, as the
//   math warps' waits for landed tiles. Not through the copiers' issue rate (shorter loops, earlier index reads
//   gain nothing) nor through too few copies in flight (more made them slower): the gathers alone take 55.8 us
//   for G2 (the probe), against 67.8 us of math, so they must overlap almost wholly. G2 and G5 each multiply
//   34-35 GFLOP, 48.5 and 49.9 us at the matmul rate the suite measures: the math alone runs at about 72 % of it.
//   MLA is bound by its math (no faster with no copies); G1 and M1, 21.6 and 36.6 us with no copies, by their
//   math and fixed costs.
//   The loads alone (no GEMMs; every hand-off, the softmax of zeros and the epilogue kept; timed without the
//   correctness check), another run, three repetitions' means:
//     main                                                23.0 81.0 95.9 75.6 75.5 / 39.1 146.6 140.8  56.6 249.1
//     the loads alone                                     19.3 75.4 87.2 73.7 64.4 / 28.2  93.8  92.8  45.4 122.5
//   So G2 misses its target of 72 us even with free tensor cores: its gathers (55.8 us in the probe), softmax
//   and fixed costs bound it. G5 takes 64.4 us without its GEMMs and 68.3 with no copies (the run above), 75.5
//   with both. For G1 both exceed 14 us.
//   tried in the same run: the V wait inside the tensor-core turn, between the S and PV issues (FlashAttention
//   3's order): G 23.0 81.4 96.5 76.2 75.8, the same as main; not kept.
//   The gather probe (GPU suite of 8577cbe): G2's gathers alone 50.0 us, 46.2 with two tiles in flight per
//   copier group; G5's 41.5 and 34.8 us. G5's gathers alone are well short of its math's tile phase, and more
//   copies in flight speed them up when nothing else runs, yet slowed the kernel. Then (development script, same
//   run, three repetitions' means, G1 G2 G3 G4 G5):
//     main                                                23.1 81.3 95.3 75.5 75.8
//     the K copier arriving on its copies (two K tiles in flight), the rest as main
//                                                         23.1 85.6 95.9 76.2 79.0
//     the same, K tile t issued only once V tile t - 1 is (V's copies first, as the math needs them)
//                                                         24.2 87.0 97.6 76.5 83.9
//   Both slower, the second more: not V's copies queued behind K's. Per-CTA clocks of the first segment (a
//   development build with clock64 around each wait; us, median over CTAs, G2 / G5): the tile phase; the K
//   copier issuing (a tile's copies, then the next tile's rows), waiting for a free buffer, for its copies; the V
//   copier waiting for a free buffer, for its copies; the math warps waiting for K, for V (main and the loads
//   alone from one run, the arrive-on-copies variant from another whose main read within 0.6 us of this one):
//     main                          70.0 / 65.5; 59.8 / 54.2, 2.6 / 2.7, 1.2 / 1.2; 17.1 / 17.9, 12.7 / 4.3;
//                                   10.8 / 5.4, 3.7 / 3.6
//     K arriving on its copies      74.9 / 65.9; 63.6 / 53.7, 3.3 / 2.9, 0 / 0; 25.1 / 18.4, 8.5 / 3.4;
//                                   13.4 / 4.6, 4.2 / 3.9
//     the loads alone (no GEMMs)    61.6 / 55.6; 53.6 / 46.7, 2.4 / 2.5, 1.1 / 1.1; 18.2 / 18.6, 7.4 / 9.7;
//                                   20.7 / 14.0, 3.6 / 3.5
//   The K copier is busy all along: issuing a tile's copies and finding the next tile's rows (whose kv_indices
//   read waits behind the copies) takes 1.6-1.8 us a tile, about the math's time per tile, so the math waits
//   for K. The SM clock reads 1.74-1.76 GHz while the GEMMs run and 1.96-1.97 GHz without them (the loads-alone
//   build): in cycles the K copier's loop costs about the same with or without the GEMMs (G5: 95k against 92k),
//   so the GEMMs slow the gathers through the clock they leave, not through shared-memory or issue contention.
//   The lever is the K copier's cycles per tile (about 2.9k for G5's 32 KB tile), which more tiles in flight do
//   not shorten. Also found: Q in registers (S's GEMM reading only K from shared memory) does not fit; the math
//   warps spill 172 bytes in the tile loop at 224 registers (at 232 the gatherers, at 40, spill too).
//   In cycles the tile phase is the load path's: with the GEMMs (1.75 GHz) G2's takes 122.5k and G5's 114.6k
//   cycles, without them (1.97 GHz) 121.0k and 109.3k; the math alone takes G5 about 98k.
// Then the copy loops again (development script, same runs, three repetitions' means, us,
// G1 G2 G3 G4 G5 / M1 M2 M3 M4 M5):
//   main                                                  24.9 83.9 96.2 76.8 77.5 / 37.5 142.6 141.2 57.5 248.6
//   a row's source chosen once (a missing row reads nothing from q's first row at the same offsets), its
//     blocks constant offsets from it, folded into the copies (hd128 SASS: 1284 -> 980 selects)
//                                                         24.3 82.2 91.8 76.8 74.9 / 38.1 144.8 144.0 57.9 255.0
//   kept for GQA; MLA, whose math bounds it, keeps a choice per copy (why the shorter loop, nine blocks a row
//   with no select between its copies, slows it was not measured). An earlier form, the source chosen once and a
//   stride of 0 or 64 elements, gained less (G3 96.4 -> 93.3, G5 77.8 -> 76.9) and cost MLA more (M5 +8.8 us).
//   tried in the same runs: an L2 hint to fetch 256 bytes on a miss (cp.async ... L2::256B, a K/V row of Dqk
//   128): G 24.9 85.6 97.4 78.4 77.7 / M 38.1 142.4 142.2 57.6 250.1 against main's 24.7 84.1 96.4 77.0 77.8 /
//   38.1 141.7 141.2 57.4 248.8; not kept.
//   Then without the GEMMs again (S zeros the compiler cannot fold, no PV GEMM; the rest kept), same run, three
//   repetitions' means, G1-G5: main 24.5 82.2 91.3 77.0 75.1, no GEMMs 24.1 73.4 85.2 75.3 64.1. G2 still misses
//   72 us with free tensor cores; G5's loads path is 11 us shorter than the whole.
//   tried after (development script, same run, three repetitions' means, G1-G5): a third K buffer (kKStages; the
//   zero tile shrunk to one 64-column block that the first PV GEMM's descriptor reads as both, to make room: Q 32
//   + K 96 + V 64 + zeros 16 KiB), so the K copier could run a tile further ahead: 24.4 82.9 92.2 77.0 75.7
//   against main's 24.3 83.1 92.2 76.8 75.4 (the same only for the 128-row tiles: 24.9 83.3 92.3 76.9 75.7). The
//   K copier waits 2.7 us of G5's tile phase for a free buffer (the per-CTA clocks above) and is busy issuing the
//   rest: a buffer more gives it nothing to fill; not kept.
//   tried in the next run: a split piece's slices published in min(pieces, 4) rounds, one barrier and release
//   each, two pieces starting half the slices apart (each publishes two slices, then completes and merges the
//   other two), G 25.0 84.0 92.7 76.9 76.5 / M 37.6 141.7 141.8 58.1 249.7 against main's 24.2 82.5 91.8 76.9
//   75.1 / 37.8 144.5 142.0 57.7 248.5; not kept. In the run after, piece s starting at slice s as on main (with two
//   pieces, their first rounds share a slice, complete once both have published that round): G 25.0 83.9 92.1
//   76.8 76.3 / M 38.2 141.9 141.9 57.9 250.5 against main's 24.9 81.7 91.2 76.8 75.1 / 37.5 143.6 142.3 57.9
//   251.8; not kept. The rounds variant above had gained G5 1.4 us; in these runs both orderings lose G5 1.2-1.4
//   and G2 1.5-2.2 us, and gain only MLA's M2 (1.7-2.8 us).
//   The two pieces of a row tile as a cluster pair (cluster.cuh, merge_pair): with one piece per CTA, a row tile
//   of two pieces starting on an even CTA has them on the two CTAs of a cluster of two. Piece 1 stages its output
//   and log-sum-exps in its shared memory and signals piece 0 (a remote mbarrier arrival), which reads them
//   through distributed shared memory, merges and writes the rows; no partial in the workspace, no counters.
//   Development script, same run, three repetitions' means, every wide launch in clusters (G1 G2 G3 G5):
//     main                                                24.4 81.6 91.2 75.1
//     cluster pairs                                       25.3 86.6 87.5 74.1
//   G3 and G5 (56-64 row tiles of two pieces on 132 CTAs) gain 3.7 and 1.0 us; G1 and G2, whose row tiles have
//   eight pieces and never pair, lose 0.9 and 5.0 us to the cluster launch alone (its cause not measured apart:
//   the grid of whole clusters, or where the scheduler puts them). So the host launches in clusters only where
//   equal trees make row tiles of two pieces (grid / 3 < row tiles <= grid / 2), and everything else as before.
// What bounds G5's 8x over Triton (which asks 68.4-68.8 us in the committed runs). Development script, same run,
// three repetitions' means, builds of 2afa9eb with one stage dropped (where copies are dropped the K and V buffers
// are zeroed once; without GEMMs S is zeros the compiler cannot fold and P is kept alive), us, G1 G2 G3 G4 G5:
//   main                                                  23.5 81.7 85.8 75.7 73.2
//   the K copier copying nothing (V gathered)             23.0 72.7 70.3 55.3 70.3
//   the V copier copying nothing (K gathered)             23.1 73.8 73.2 54.9 70.1
//   neither copying (the math alone)                      21.9 67.2 65.5 44.7 66.9
//   no GEMMs (every copy kept)                            23.8 74.5 79.8 74.2 63.6
//   no GEMMs and no copies                                18.1 46.7 45.4 29.9 46.3
// G5's math alone takes 66.9 us, but with either half of its gathers (K's or V's) it takes 70.1-70.3: a kernel that
// does all the math and only half the copies misses 68.8 us, as G2's loads alone miss 72. Each half costs about
// 3 us and both 6.3, so it is not one copier's issue rate. Without copies or GEMMs (softmax, hand-offs, epilogue)
// G5 takes 46.3 us, about as long as its GEMMs at the measured matmul rate (48-50 us); the math alone overlaps the
// two to 66.9 us, 72 % of that rate.
// With SGLang's Triton kernel in the same run (another machine, two rounds, us, G5): main 72.2 72.2, Triton 549.0
// 549.4 (8x asks 68.6 68.7), the K copier copying nothing 69.1 69.1, the V copier copying nothing 68.8 68.9. Half
// of the gathers still misses 8x there, by 0.2 us: thin, but in both rounds.
// Power, the same builds replayed back to back for 2.5 s (nvidia-smi every 20 ms, medians; two runs): G5's main
// draws 690 W of the board's 700 W limit at 1.80-1.82 GHz (78.3 us a call), its math alone 310 W at 1.98 GHz
// (66.0 us), its loads alone 431 W at 1.98 GHz (61.6 us); G2's main 690 W at 1.76-1.78 GHz (84.7-85.3 us), math
// alone 310 W, loads alone 470-500 W, both at 1.98 GHz. In a steady stream of calls the GEMMs and the copies
// together are bound by the power limit, each alone is not: the clock drop read above (1.75 GHz "while the GEMMs
// run") is that of the GEMMs with the copies. (A build that printed CTA 0's clock64 against globaltimer read
// 1.79-1.81 GHz in the benchmark's bursts with and without copies, but ran 17 us slower than main: not a reading of
// main's clock.)
// Every split workload: the rest of the fixed costs (the schedule and setup, about 1500 cold instructions with
// four 64-bit divisions, about 5 us; publication and merge 9-12 us): shorter code there, a merge by more threads
// than the eight math warps; the cluster pairs (above) for more shapes than two pieces per row tile. MLA: the
// math (a softmax per tile with the tensor cores idle), which the seesaw overlaps only at the cost of buffer time.
// (A trap for such variants: with the output stores removed, ptxas drops the PV wgmma whose accumulators are
// dead, so "no epilogue" variants time no PV GEMM.)
// Tried, each slower:
//   clusters of two CTAs on consecutive row tiles sharing every K/V tile through distributed shared memory
//   (a bulk copy of what each gathered into the other's buffer, mbarrier complete-tx; correct on every check):
//     one CTA gathers a whole tile and sends it             36 122 111  78 115 /  66 276 277 107 490
//     each gathers half of every tile and sends that half   35 111 110  80 107 /  59 215 216  92 365
//   (without clusters, the same day: 27 104 111 79 99 / 54 191 194 83 321). A tile waits for its gather and
//   then for the copy to the peer before either CTA computes on it: more latency per buffer, the bound above.
//   TMA boxes of one (row, 128-byte chunk) each, the only TMA gather on sm_90 (its 128-byte swizzle follows the
//   shared-memory address, so such boxes land in the kernel's layout): 318 us for M2's tiles in the probe
//   (14.8 GB/s per SM, a 128-byte box per 17 cycles per SM), seven times the cp.async gather's time.
#pragma once

#include "tree_verify_kernel.cuh"

namespace kdtree::cuda {

// GQA/MHA. BLOCK_M = 64 packed rows (4 warps x 16): a DDTree tree of 16..64 tokens x 4 heads fills one or a few
// row tiles without padding waste; 2 stages of 64-key K and V tiles. Dqk 256 halves BLOCK_N to hold the
// 16 x 256 fp32 accumulators of each warp in registers (128 per thread).
template <typename T> using Hd64Config = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 2>;
template <typename T> using Hd128Config = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 2>;
template <typename T> using Hd256Config = TreeVerifyConfig<T, 256, 256, 64, 32, 1, 2>;

// MLA (absorbed: Hkv = 1, Dqk = 576, Dv = 512). The 64 x 512 output does not fit 4 warps' registers, so 8 warps
// split it (WARPS_N = 2: each warp 16 rows x 256 columns = 128 fp32 per thread) and the 32-key tile's scores.
// Shared memory: Q 72 KiB + 2 x (K 36 KiB + V 32 KiB) = 208 KiB of the 227 KiB an H200 CTA may use.
template <typename T> using MlaConfig = TreeVerifyConfig<T, 576, 512, 64, 32, 2, 2>;

// sm_90a (wgmma, one warpgroup per 64 rows). GQA/MHA: two warpgroups share each K/V tile (BLOCK_M 128), and
// 128-key tiles give S = Q Kᵀ wgmma N = 128, whose shared-memory reads stay under the bandwidth the tensor
// cores need; P stays in registers. With Dv <= 128 a third warpgroup gathers the K/V tiles into two buffers
// each (Q 32 KiB + K 64 KiB + V 64 KiB + the zero tile 32 KiB for Dqk 128). Dqk 256 keeps BLOCK_N 64 so the
// 64 x 256 fp32 accumulators fit; its math warps gather their own tiles.
template <typename T> using Hd64Wgmma = TreeVerifyConfig<T, 64, 64, 128, 128, 1, 2, true>;
template <typename T> using Hd128Wgmma = TreeVerifyConfig<T, 128, 128, 128, 128, 1, 2, true>;
template <typename T> using Hd256Wgmma = TreeVerifyConfig<T, 256, 256, 128, 64, 1, 2, true>;
// Short trees (at most 64 packed rows per request, e.g. 16 tokens x 4 heads) would leave half of a 128-row
// tile empty: one warpgroup per CTA and 64-key tiles (two CTAs per SM where shared memory allows: Dqk <= 128).
template <typename T> using Hd64WgmmaNarrow = TreeVerifyConfig<T, 64, 64, 64, 64, 1, 2, true>;
template <typename T> using Hd128WgmmaNarrow = TreeVerifyConfig<T, 128, 128, 64, 64, 1, 2, true>;
template <typename T> using Hd256WgmmaNarrow = TreeVerifyConfig<T, 256, 256, 64, 64, 1, 2, true>;
// MLA where V is not K's first 512 columns: two warpgroups split S's 64 keys (wgmma N = 32) and O's 512 columns
// (N = 256, P through shared memory).
// Q 72 KiB + 2 x K 72 KiB + P 8 KiB fill the shared memory, so there are no V tiles: V is the K tile's first
// 512 columns (separate draft V is loaded over them after S).
template <typename T> using MlaWgmmaKeySplit = TreeVerifyConfig<T, 576, 512, 64, 64, 2, 2, true, false>;
// MLA where V is K's first 512 columns (SGLang's latent pool, with draft K/V in it or V a view of draft K): the
// warpgroups take the 64-key tiles in turns (wgmma N = 64 for S) and one more warpgroup gathers them.
// Q 72 KiB + 2 x K 72 KiB; P lives in each K tile's last 64 columns.
template <typename T> using MlaWgmma = TreeVerifyConfig<T, 576, 512, 64, 64, 2, 2, true, false, true>;

// A CTA takes at least this many KV tiles: a split piece costs a fp32 partial write and read (BLOCK_M x Dv x 8
// bytes, about two KV tiles of traffic), so pieces shorter than this cost more than the parallelism gains.
constexpr int kMinUnitsPerCta = 4;

}  // namespace kdtree::cuda
