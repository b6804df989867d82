// Suffix decoding's lookups (verispec/proposers/suffix.py), the same result as
// suffix.chain_lookup in Python: the context suffix's occurrences (from the newest
// `recent` of its longest anchor found), then, at each of the `tried` longest match
// lengths m, the likeliest chain through the continuations of the occurrences matching
// at least m tokens. suffix_chains reads a SuffixIndex's stream and anchor chains (a
// store); suffix_scan scans one request's own context, which finds what that context's
// index would.
//
// Why native: the lookups run once per step right after a target forward, which
// streams the weights through every cache level. In Python their objects and code are
// then cold, and they cost several times their warm time (docs/suffix.md, "Host work
// per step").
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

constexpr int64_t kSentinel = -1;  // ends every sequence of the stream

struct Occurrence {
  int64_t length;    // tokens of the context's suffix matched
  int64_t position;  // stream position of the matched suffix's last token
};

// The likeliest chain through `paths` (each a continuation, node order of the trie
// Python's grow_draft builds): at each depth the child with the most paths, ties to
// the first to appear, while its share of all paths stays >= min_prob.
void likeliest_chain(const std::vector<std::vector<int64_t>>& paths, int64_t depth, double min_prob,
                     const std::vector<int64_t>& stop, SuffixChain& out) {
  const double total = static_cast<double>(paths.size());
  std::vector<size_t> alive(paths.size());
  for (size_t p = 0; p < paths.size(); ++p) alive[p] = p;
  std::vector<int64_t> seen;    // distinct next tokens, in order of first appearance
  std::vector<int64_t> counts;  // paths through each
  for (int64_t d = 0; d < depth && !alive.empty(); ++d) {
    seen.clear();
    counts.clear();
    for (size_t p : alive) {
      if (static_cast<int64_t>(paths[p].size()) <= d) continue;
      const int64_t token = paths[p][d];
      const auto at = std::find(seen.begin(), seen.end(), token);
      if (at == seen.end()) {
        seen.push_back(token);
        counts.push_back(1);
      } else {
        ++counts[at - seen.begin()];
      }
    }
    if (seen.empty()) break;
    const size_t best = std::max_element(counts.begin(), counts.end()) - counts.begin();  // first max
    const double prob = static_cast<double>(counts[best]) / total;
    if (prob < min_prob) break;
    const int64_t token = seen[best];
    out.tokens.push_back(token);
    out.probs.push_back(prob);
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) break;  // nothing past a stop
    std::vector<size_t> next;
    for (size_t p : alive) {
      if (static_cast<int64_t>(paths[p].size()) > d && paths[p][d] == token) next.push_back(p);
    }
    alive.swap(next);
  }
}

// The chains of `found` (sorted longest first) through `stream`, whose global position
// p sits at p - offset; a continuation ends at a sentinel or the stream's end.
SuffixLookup chains_from(const std::vector<Occurrence>& found, const int64_t* stream, int64_t size,
                         int64_t offset, int64_t k, const std::vector<int64_t>& caps, double min_prob,
                         const std::vector<int64_t>& stop, int64_t tried) {
  SuffixLookup out;
  out.longest = found.empty() ? 0 : found.front().length;
  std::vector<std::vector<int64_t>> paths;
  int64_t lengths = 0;
  for (size_t first = 0; first < found.size() && lengths < tried;) {
    const int64_t m = found[first].length;
    size_t end = first;
    while (end < found.size() && found[end].length == m) ++end;
    ++lengths;
    const int64_t depth = std::min(k, caps[std::min<int64_t>(m, static_cast<int64_t>(caps.size()) - 1)]);
    first = end;
    if (depth < 1) continue;
    paths.clear();  // every occurrence matching at least m tokens: the sorted prefix
    for (size_t o = 0; o < end; ++o) {
      std::vector<int64_t> path;
      const int64_t begin = found[o].position + 1 - offset;
      for (int64_t at = begin; at < size && at < begin + depth && stream[at] != kSentinel; ++at) {
        path.push_back(stream[at]);
      }
      paths.push_back(std::move(path));
    }
    SuffixChain chain;
    chain.match_length = m;
    likeliest_chain(paths, depth, min_prob, stop, chain);
    if (!chain.tokens.empty()) out.chains.push_back(std::move(chain));
  }
  return out;
}

// The occurrences of the first anchor length (longest first) that has any, longest match
// first, equal lengths newest first: `walk(a, n, found)` collects anchor a's (n tokens).
template <typename Walk>
std::vector<Occurrence> occurrences(const std::vector<int64_t>& anchors, int64_t query_length,
                                    Walk walk) {
  std::vector<Occurrence> found;
  for (size_t a = 0; a < anchors.size() && found.empty(); ++a) {
    if (query_length >= anchors[a]) walk(a, anchors[a], found);
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Occurrence& x, const Occurrence& y) { return x.length > y.length; });
  return found;
}

}  // namespace

SuffixLookup suffix_chains(const int64_t* tokens, int64_t size, int64_t offset, int64_t live,
                           const std::vector<int64_t>& anchors, const std::vector<int64_t>& heads,
                           const std::vector<const int64_t*>& chains, const std::vector<int64_t>& query,
                           int64_t recent, int64_t k, const std::vector<int64_t>& caps, double min_prob,
                           const std::vector<int64_t>& stop, int64_t tried) {
  const int64_t q = static_cast<int64_t>(query.size());
  const auto found = occurrences(anchors, q, [&](size_t a, int64_t n, std::vector<Occurrence>& out) {
    for (int64_t i = heads[a]; i >= live && static_cast<int64_t>(out.size()) < recent;) {
      int64_t m = n;
      // A sentinel precedes every sequence and equals no token, so the walk stops
      // inside the stream; the bound only guards a malformed index.
      while (m < q && i - m - offset >= 0 && tokens[i - m - offset] == query[q - 1 - m]) ++m;
      out.push_back({m, i});
      i = chains[a][i - offset];
    }
  });
  return chains_from(found, tokens, size, offset, k, caps, min_prob, stop, tried);
}

SuffixLookup suffix_scan(const int64_t* context, int64_t size, const std::vector<int64_t>& anchors,
                         const std::vector<int64_t>& query, int64_t recent, int64_t k,
                         const std::vector<int64_t>& caps, double min_prob,
                         const std::vector<int64_t>& stop, int64_t tried) {
  const int64_t q = static_cast<int64_t>(query.size());
  const auto found = occurrences(anchors, q, [&](size_t, int64_t n, std::vector<Occurrence>& out) {
    // Newest first, as a hash chain lists them: every end of the anchor with a continuation.
    for (int64_t i = size - 2; i >= n - 1 && static_cast<int64_t>(out.size()) < recent; --i) {
      int64_t m = 0;
      while (m < q && i - m >= 0 && context[i - m] == query[q - 1 - m]) ++m;
      if (m >= n) out.push_back({m, i});
    }
  });
  return chains_from(found, context, size, 0, k, caps, min_prob, stop, tried);
}
