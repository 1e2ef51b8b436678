// The DDTree build's order, in one place for the CPU and CUDA implementations: a frontier entry of tree node p is
// p's next child (p's path plus candidate rank next_child[p] at the next position); entries sort by descending
// score, then shallower, then by the lexicographically smaller tuple of candidate ranks. Two entries of one depth
// extend distinct nodes p != q of one depth, whose rank tuples already differ, so the last rule compares p and q.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KDTREE_HD __host__ __device__ __forceinline__
#else
#define KDTREE_HD inline
#endif

namespace kdtree {

// Order-preserving uint32 key of a float32 score: a higher score has a larger key, -0 and +0 share one (float
// comparison calls them equal, so the tie rules decide). Key 0 (below -inf's 0x007FFFFF) means "no entry".
KDTREE_HD uint32_t ddtree_score_key(float score) {
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof(bits));
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
constexpr uint32_t kDdtreeNoEntry = 0u;

// Tree nodes a != b of one depth: is a's rank tuple lexicographically smaller? Walk both up to the children of
// their lowest common ancestor and compare those ranks. parent[] and rank[] are the tree's (root: parent -1).
KDTREE_HD bool ddtree_lex_before(const int32_t* parent, const int32_t* rank, int32_t a, int32_t b) {
  while (parent[a] != parent[b]) {
    a = parent[a];
    b = parent[b];
  }
  return rank[a] < rank[b];
}

// Does the entry of node a (key_a, depth of a) sort before the entry of node b? a != b unless both are absent.
KDTREE_HD bool ddtree_entry_before(uint32_t key_a, int32_t depth_a, int32_t a, uint32_t key_b, int32_t depth_b,
                                   int32_t b, const int32_t* parent, const int32_t* rank) {
  if (key_a != key_b) return key_a > key_b;
  if (key_a == kDdtreeNoEntry || a == b) return false;
  if (depth_a != depth_b) return depth_a < depth_b;
  return ddtree_lex_before(parent, rank, a, b);
}

}  // namespace kdtree
