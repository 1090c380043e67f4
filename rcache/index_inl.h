// The index's writers (templates of rcache/index.h; included by it only). Every change publishes a
// consistent index: a leaf is built aside and stored into its Top slot, or a new Top is built and
// stored into top_; what it replaces is retired.
#pragma once

namespace gmd::rcache::detail {

template <typename Node>
template <typename F>
void Index<Node>::forEachOverlap(std::uintptr_t start, std::uintptr_t end, F f) const noexcept {
  const TopT* top = current();
  std::size_t i = leafAt(start);
  const LeafT* leaf = top->leaf(i);
  std::size_t k = upperIn(i, leaf, start, leaf->count());
  remember(i, k);
  if (k != 0) {
    --k;  // the floor entry; it overlaps if it reaches past start
    if (leaf->entry(k).end() <= start) ++k;
  } else if (i != 0) {
    const LeafT* prev = top->leaf(i - 1);
    const std::size_t n = prev->count();
    if (n != 0) {
      const Entry last = prev->entry(n - 1);
      if (last.end() > start) f(last);
    }
  }
  for (; i < top->size; ++i, k = 0) {
    leaf = top->leaf(i);
    const std::size_t n = leaf->count();
    for (; k < n; ++k) {
      const Entry e = leaf->entry(k);
      if (e.start >= end) return;
      f(e);
    }
  }
}

// Publishes a Top in which leaves [first, first + count) are replaced by leaves[0, n) with keys
// keys[0, n) (key 0 is forced to 0). On success retires the old Top and the replaced leaves; on
// failure (no memory) changes nothing and the caller still owns `leaves`.
template <typename Node>
bool Index<Node>::replaceLeaves(std::size_t first, std::size_t count, LeafT* const* leaves,
                                const std::uintptr_t* keys, std::size_t n) noexcept {
  TopT* cur = current();
  const std::size_t size = cur->size - count + n;
  TopT* next = size != 0 ? TopT::allocate(size) : nullptr;
  if (size != 0 && next == nullptr) return false;
  if (next == nullptr) {  // the index becomes empty
    top_.store(&empty_.top, std::memory_order_seq_cst);
  } else {
    // Plain copies of the slots on either side (trivially copyable; only this writer stores
    // into them), the new ones between.
    TopSlot<Node>* to = next->slots();
    const TopSlot<Node>* from = cur->slots();
    std::memcpy(to, from, first * sizeof(TopSlot<Node>));
    for (std::size_t i = 0; i < n; ++i) to[first + i] = TopSlot<Node>{keys[i], leaves[i]};
    std::memcpy(to + first + n, from + first + count,
                (cur->size - first - count) * sizeof(TopSlot<Node>));
    to[0].key = 0;
    top_.store(next, std::memory_order_seq_cst);
  }
  for (std::size_t i = first; i < first + count; ++i) {
    LeafT* old = cur->leaf(i);
    if (!isEmptyLeaf(old)) retire(old);
  }
  if (!isEmptyTop(cur)) retire(cur);
  return true;
}

// Rewrites leaf i with `add` (may be null; it must overlap no entry) and without the entries of
// `drop` (a list linked by nextUnindex(), sorted by start, of regions whose entries are in this
// leaf). In place under the leaf's sequence lock when the result fits its block and neither
// empties it nor makes it merge; otherwise into a new leaf (a bigger block), splitting a leaf that
// grows past kLeafMax and merging one that shrinks below kLeafMin into a neighbour. Only the
// regions of `add` and `drop` are looked at, never the others (in a big cache they are cold). Sets
// in_index_ of `add`, clears it for `drop`, and counts in *removed (when not null) the entries of
// `drop` that left. On failure (no memory) changes nothing.
template <typename Node>
bool Index<Node>::rewriteLeaf(std::size_t i, Node* add, Node* drop, std::size_t* removed) noexcept {
  TopT* top = current();
  LeafT* old = top->leaf(i);
  const std::size_t size = old->count();
  // Whether entry e is the next one of the drop list d (advanced past the entries it skips).
  auto dropped = [](const Entry& e, const Node*& d) {
    while (d != nullptr && d->start() < e.start) d = d->nextUnindex();
    if (d != e.region()) return false;
    d = d->nextUnindex();
    return true;
  };

  if (!isEmptyLeaf(old)) {
    // Entries below the first one dropped stay where they are: start from there (a binary search;
    // the list is sorted).
    std::size_t first = size;
    if (drop != nullptr) {  // Leaf::lower(): starts are unique (the entries are disjoint)
      first = upperIn(i, old, drop->start(), size);
      if (first != 0 && old->startAt(first - 1) == drop->start()) --first;
    }
    std::size_t n = size + (add != nullptr ? 1 : 0);
    std::size_t at = size;  // where the first dropped entry is
    const Node* d = drop;
    for (std::size_t k = first; k < size && d != nullptr; ++k) {
      if (dropped(old->entry(k), d)) {
        if (at == size) at = k;
        --n;
      }
    }
    // A leaf under kLeafMin entries that no neighbour can take (the copy path would only copy it
    // into a smaller block, at every removal) is edited in place too. So is the only leaf when
    // its last entry leaves: it stays, empty, for the next insertion (a cache that registers and
    // drops one region at a time would otherwise allocate a leaf, retire it and free it through
    // a collection at every miss). Only an index of one leaf has an empty leaf other than the
    // shared one.
    auto mergeable = [&] {
      return (i + 1 < top->size && n + top->leaf(i + 1)->count() <= kLeafMax) ||
             (i > 0 && n + top->leaf(i - 1)->count() <= kLeafMax);
    };
    if (n <= old->capacity() && (n != 0 || top->size == 1) &&
        (n >= kLeafMin || top->size == 1 || !mergeable())) {
      // In place. Entries k of the leaf are slots f + k; each edit moves the entries on its
      // shorter side.
      const std::size_t cap = old->capacity();
      std::size_t f = old->first();
      std::size_t j = size;  // entries now
      old->beginEdit();
      if (size + (add != nullptr ? 1 : 0) - n == 1) {
        // One removal, at `at`: close the gap from the nearer end.
        old->slotEntry(f + at).region()->in_index_ = false;
        if (at < size - 1 - at) {
          for (std::size_t k = at; k > 0; --k) old->setSlot(f + k, old->slotEntry(f + k - 1));
          ++f;
        } else {
          for (std::size_t k = at; k + 1 < size; ++k) {
            old->setSlot(f + k, old->slotEntry(f + k + 1));
          }
        }
        --j;
        // Where a purge of the entry after it will look (evicting in release order).
        if (add == nullptr) remember(i, std::min(at + 1, j));
      } else if (at != size) {
        // Several: compact the kept ones down from the first removal.
        j = at;
        d = drop;
        for (std::size_t k = at; k < size; ++k) {
          const Entry e = old->slotEntry(f + k);
          if (d != nullptr && dropped(e, d)) {
            e.region()->in_index_ = false;
            continue;
          }
          if (j != k) old->setSlot(f + j, e);
          ++j;
        }
      }
      old->setShape(f, j);
      if (removed != nullptr) *removed = size - j;
      if (add != nullptr) {
        // Open a slot at p, moving the shorter side when there is room on it (there is room on
        // one side: j < cap).
        const std::size_t p = upperIn(i, old, add->start(), j);
        if (f + j == cap || (f != 0 && p < j - p)) {
          for (std::size_t k = 0; k < p; ++k) old->setSlot(f - 1 + k, old->slotEntry(f + k));
          --f;
        } else {
          for (std::size_t k = j; k > p; --k) old->setSlot(f + k, old->slotEntry(f + k - 1));
        }
        old->setSlot(f + p, Entry::of(add));
        ++j;
        old->setShape(f, j);
        add->in_index_ = true;
        remember(i, p + 1);  // where the invalidation of `add` will look
      }
      old->endEdit();
      return true;
    }
  }

  // The entries of l but those of d (sorted), and `a` (may be null) in its place, into out;
  // returns their number.
  auto gather = [&dropped](const LeafT* l, Node* a, const Node* d, Entry* out) {
    std::size_t j = 0;
    const std::size_t n = l->count();
    const std::size_t f = l->first();
    for (std::size_t k = 0; k < n; ++k) {
      const Entry e = l->slotEntry(f + k);
      if (a != nullptr && a->start() < e.start) {
        out[j++] = Entry::of(a);
        a = nullptr;
      }
      if (!dropped(e, d)) out[j++] = e;
    }
    if (a != nullptr) out[j++] = Entry::of(a);
    return j;
  };
  auto makeLeaf = [](const Entry* from, std::size_t n) {
    LeafT* l = LeafT::allocate(n);
    if (l != nullptr) {
      for (std::size_t k = 0; k < n; ++k) l->setSlot(k, from[k]);  // first slot 0
    }
    return l;
  };

  // An insertion after the last entry of a full leaf (ascending addresses: what allocators and
  // sequential registrations produce) starts a new leaf after it, in a full-size block, and leaves
  // the old one as it is: no entry is copied, and the next insertions in ascending order go into
  // the new leaf in place, where an even split would copy half a leaf now and a growing half
  // again later. Leaves filled this way are full (memory) and split half as often.
  if (add != nullptr && drop == nullptr && size == kLeafMax && !isEmptyLeaf(old) &&
      old->startAt(size - 1) < add->start()) {
    LeafT* next = LeafT::allocate(kLeafMax);
    if (next == nullptr) return false;
    next->setSlot(0, Entry::of(add));
    next->setShape(0, 1);
    LeafT* const leaves[1] = {next};
    const std::uintptr_t keys[1] = {add->start()};
    if (!replaceLeaves(i + 1, 0, leaves, keys, 1)) {
      LeafT::release(next);
      return false;
    }
    add->in_index_ = true;
    remember(i + 1, 1);
    return true;
  }

  bool done = false;
  Entry buf[2 * kLeafMax + 1];  // this leaf (+ add), then possibly a neighbour
  const std::size_t n = gather(old, add, drop, buf);
  const std::uintptr_t key = top->slots()[i].key;
  if (n == 0 && top->size > 1) {
    done = replaceLeaves(i, 1, nullptr, nullptr, 0);  // drop the leaf
  } else if (n > kLeafMax) {
    // Split: the lower half keeps the key, the upper half starts at its first entry.
    LeafT* lo = makeLeaf(buf, n / 2);
    LeafT* hi = makeLeaf(buf + n / 2, n - n / 2);
    if (lo != nullptr && hi != nullptr) {
      LeafT* const leaves[2] = {lo, hi};
      const std::uintptr_t keys[2] = {key, buf[n / 2].start};
      done = replaceLeaves(i, 1, leaves, keys, 2);
    }
    if (!done) {
      if (lo != nullptr) LeafT::release(lo);
      if (hi != nullptr) LeafT::release(hi);
    }
  } else {
    // A small leaf merges into a neighbour when both fit in one leaf.
    std::size_t m = 0;  // the neighbour's entries, gathered after ours
    std::size_t with = top->size;
    if (n < kLeafMin && top->size > 1) {
      // A neighbour's invalid entries come along; they leave with their own purge.
      if (i + 1 < top->size && n + (m = top->leaf(i + 1)->count()) <= kLeafMax) {
        with = i + 1;
      } else if (i > 0 && n + (m = top->leaf(i - 1)->count()) <= kLeafMax) {
        with = i - 1;
      }
      if (with != top->size) gather(top->leaf(with), nullptr, nullptr, buf + n);
    }
    if (with != top->size) {
      // buf holds [ours, theirs]; the merged leaf wants them in address order.
      if (with < i) std::rotate(buf, buf + n, buf + n + m);
      const std::size_t lo_i = std::min(i, with);
      LeafT* merged = makeLeaf(buf, n + m);
      if (merged != nullptr) {
        LeafT* const leaves[1] = {merged};
        const std::uintptr_t keys[1] = {top->slots()[lo_i].key};
        done = replaceLeaves(lo_i, 2, leaves, keys, 1);
        if (!done) LeafT::release(merged);
      }
    } else {
      LeafT* next = n != 0 ? makeLeaf(buf, n) : &empty_leaf_;
      if (next != nullptr && isEmptyTop(top)) {  // shared: never written to
        LeafT* const leaves[1] = {next};
        const std::uintptr_t keys[1] = {0};
        done = replaceLeaves(0, 1, leaves, keys, 1);
        if (!done && !isEmptyLeaf(next)) LeafT::release(next);
      } else if (next != nullptr) {
        top->slots()[i].storeLeaf(next);
        if (!isEmptyLeaf(old)) retire(old);
        done = true;
      }
    }
  }
  if (!done) return false;
  // The old leaf is retired, not freed before the next collection, nor edited: mark what left it.
  const Node* d = drop;
  std::size_t left = 0;
  for (std::size_t k = 0; k < size && d != nullptr; ++k) {
    const Entry e = old->entry(k);
    if (dropped(e, d)) {
      e.region()->in_index_ = false;
      ++left;
    }
  }
  if (removed != nullptr) *removed = left;
  if (add != nullptr) add->in_index_ = true;
  return true;
}

// Reverses a list linked by nextUnindex().
template <typename Node>
Node* Index<Node>::reverse(Node* list) noexcept {
  Node* reversed = nullptr;
  while (list != nullptr) {
    Node* next = list->nextUnindex();
    list->setNextUnindex(reversed);
    reversed = list;
    list = next;
  }
  return reversed;
}

// Sorts a list linked by nextUnindex() by start, highest first (merge sort; no allocation). An
// invalidation queues the regions of its range in that order already (its walk is ascending, each
// queued at the head): that case is one pass that only reads the links.
template <typename Node>
Node* Index<Node>::sortDescending(Node* list) noexcept {
  if (list == nullptr) return list;
  bool descending = true, ascending = true;
  for (Node* r = list;;) {
    Node* next = r->nextUnindex();
    if (next == nullptr) break;
    descending = descending && next->start() < r->start();
    ascending = ascending && next->start() > r->start();
    if (!descending && !ascending) break;
    r = next;
  }
  if (descending) return list;
  if (ascending) return reverse(list);
  Node* slow = list;  // split in halves
  for (Node* fast = list->nextUnindex(); fast != nullptr && fast->nextUnindex() != nullptr;
       fast = fast->nextUnindex()->nextUnindex()) {
    slow = slow->nextUnindex();
  }
  Node* b = slow->nextUnindex();
  slow->setNextUnindex(nullptr);
  Node* a = sortDescending(list);
  b = sortDescending(b);
  Node* head = nullptr;
  Node* tail = nullptr;
  auto append = [&](Node* n) {
    if (tail != nullptr) {
      tail->setNextUnindex(n);
    } else {
      head = n;
    }
    tail = n;
  };
  while (a != nullptr && b != nullptr) {
    Node*& higher = a->start() > b->start() ? a : b;
    Node* n = higher;
    higher = higher->nextUnindex();
    append(n);
  }
  append(a != nullptr ? a : b);
  return head;
}

template <typename Node>
bool Index<Node>::purge() noexcept {
  // From the highest leaf down: a leaf that shrinks merges preferably with the one above it,
  // already purged by then.
  Node* list = sortDescending(unindex_);
  Node* retry = nullptr;
  auto retryAll = [&](Node* batch) {
    while (batch != nullptr) {
      Node* next = batch->nextUnindex();
      batch->setNextUnindex(retry);
      retry = batch;
      batch = next;
    }
  };
  while (list != nullptr) {
    // The regions of one leaf: those whose start is at or above its key, taken off the list's head
    // into `batch` in ascending order (what rewriteLeaf() walks).
    const TopT* top = current();
    const std::size_t i = leafAt(list->start());
    const std::uintptr_t key = top->slots()[i].key;
    Node* batch = nullptr;
    std::size_t n = 0;
    while (list != nullptr && list->start() >= key) {
      Node* next = list->nextUnindex();
      list->setNextUnindex(batch);
      batch = list;
      list = next;
      ++n;
    }
    std::size_t removed = 0;
    if (!rewriteLeaf(i, nullptr, batch, &removed)) {
      retryAll(batch);
      continue;
    }
    if (removed == n) continue;  // all left the index (their links are stale: nobody reads them)
    while (batch != nullptr) {   // one was not where it should be
      Node* next = batch->nextUnindex();
      batch->setNextUnindex(nullptr);
      if (batch->in_index_) {
        batch->setNextUnindex(retry);
        retry = batch;
      }
      batch = next;
    }
  }
  unindex_ = retry;
  return retry == nullptr;
}

template <typename Node>
bool Index<Node>::insert(Node* r) noexcept {
  const std::uint64_t n = insertions_.load(std::memory_order_relaxed);
  insertions_.store(n + 1, std::memory_order_relaxed);
  bool done = true;
  if (!purge()) {
    forEachOverlap(r->start(), r->end(), [&](const Entry&) { done = false; });
  }
  done = done && rewriteLeaf(leafAt(r->start()), r, nullptr);
  insertions_.store(n + 2, std::memory_order_release);  // after the entry is in its leaf
  return done;
}

}  // namespace gmd::rcache::detail
