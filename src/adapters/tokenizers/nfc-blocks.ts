/**
 * NFC over text that arrives and is split in pieces (Qwen 3's normalizer): the blocks of raw
 * text NFC normalizes independently, so a boundary of the normalized text maps back to the raw
 * text where it falls between blocks or inside a block NFC leaves alone.
 */

/** The characters before which NFC never changes what precedes (see {@link nfcBlocks}). */
function startsNfcBlock(code: number): boolean {
  if (code < 0x300) return true;
  if ((code >= 0x1161 && code <= 0x1175) || (code >= 0x11a8 && code <= 0x11c2)) return false;
  if (code === 0x16d67) return false;
  return !/\p{M}/u.test(String.fromCodePoint(code));
}

/** Characters that NFC may change (none below U+0300). */
export const mayNormalize = /[\u0300-\uffff]/;

export interface NfcBlock {
  readonly rawEnd: number;
  readonly normal: string;
  readonly normalEnd: number;
  readonly changed: boolean;
}

/**
 * Raw text in blocks that NFC normalizes independently: each starts at a character that never
 * composes with what precedes it (below U+0300, or not a mark nor a Hangul vowel or trailing
 * consonant), so NFC(text) is the concatenation of the blocks' NFC. Consecutive blocks NFC leaves
 * alone are one block.
 */
export function nfcBlocks(raw: string): NfcBlock[] {
  const blocks: NfcBlock[] = [];
  let normalEnd = 0;
  let from = 0;
  let clean = "";
  const close = (to: number) => {
    if (to <= from) return;
    const text = raw.slice(from, to);
    const normal = mayNormalize.test(text) ? text.normalize("NFC") : text;
    if (normal === text) {
      clean += text;
    } else {
      if (clean !== "") {
        normalEnd += clean.length;
        blocks.push({ rawEnd: from, normal: clean, normalEnd, changed: false });
        clean = "";
      }
      normalEnd += normal.length;
      blocks.push({ rawEnd: to, normal, normalEnd, changed: true });
    }
    from = to;
  };
  for (let i = 0; i < raw.length;) {
    const code = raw.codePointAt(i)!;
    if (i > 0 && startsNfcBlock(code)) close(i);
    i += code > 0xffff ? 2 : 1;
  }
  close(raw.length);
  if (clean !== "") {
    normalEnd += clean.length;
    blocks.push({ rawEnd: raw.length, normal: clean, normalEnd, changed: false });
  }
  return blocks;
}
