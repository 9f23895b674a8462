/**
 * The added tokens of a tokenizer.json, matched as Hugging Face's AddedVocabulary matches tokens
 * that are not normalized and have no lstrip, rstrip or single_word: on the raw text, leftmost
 * first and the longest at that position (an Aho-Corasick LeftmostLongest automaton there; a
 * trie walked from each candidate position here, the tokens being at most a few dozen
 * characters).
 */
export interface AddedTokenMatcher {
  /** Added-token texts, in file order. */
  readonly contents: readonly string[];
  /**
   * The longest added token starting at `at`: its length in UTF-16 code units (0 when none),
   * its id in `matchedId`.
   */
  longestAt(text: string, at: number): number;
  readonly matchedId: () => number;
  /**
   * The first position p >= from such that text[p..] is a proper prefix of an added token (it may
   * become one when text is appended), or -1.
   */
  pendingFrom(text: string, from: number): number;
  /** The longest added token, in UTF-16 code units. */
  readonly maxLength: number;
}

interface TrieNode {
  id: number;
  readonly next: Map<number, TrieNode>;
}

export function createAddedTokenMatcher(
  tokens: readonly { readonly content: string; readonly id: number }[],
): AddedTokenMatcher {
  const root: TrieNode = { id: -1, next: new Map() };
  let maxLength = 0;
  for (const { content, id } of tokens) {
    let node = root;
    for (let i = 0; i < content.length; i++) {
      const c = content.charCodeAt(i);
      let child = node.next.get(c);
      if (child === undefined) {
        child = { id: -1, next: new Map() };
        node.next.set(c, child);
      }
      node = child;
    }
    // A content listed twice keeps its first id (HF adds the token once).
    if (node.id < 0) node.id = id;
    maxLength = Math.max(maxLength, content.length);
  }
  let matched = -1;
  return {
    contents: tokens.map((t) => t.content),
    maxLength,
    matchedId: () => matched,
    longestAt(text, at) {
      let node: TrieNode | undefined = root;
      let length = 0;
      for (let i = at; i < text.length; i++) {
        node = node.next.get(text.charCodeAt(i));
        if (node === undefined) break;
        if (node.id >= 0) {
          length = i + 1 - at;
          matched = node.id;
        }
      }
      return length;
    },
    pendingFrom(text, from) {
      for (let p = Math.max(from, text.length - maxLength + 1); p < text.length; p++) {
        let node: TrieNode | undefined = root;
        for (let i = p; i < text.length && node !== undefined; i++) {
          node = node.next.get(text.charCodeAt(i));
        }
        if (node !== undefined && node.next.size > 0) return p;
      }
      return -1;
    },
  };
}
