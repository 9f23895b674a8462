/** The text a Responses stream holds (responses-stream.ts): flat pieces, cut on a code point. */

/** Deltas are joined into one flat string once this many code units have come. */
const pieceChars = 8192;

/**
 * Text held as it comes. Appending to a string makes a rope: a node (and the delta's own string)
 * per delta, tens of bytes each, many times the text for one-token deltas. Here the deltas are
 * joined into flat pieces of about {@link pieceChars} units, so the memory is the text's.
 */
export class HeldText {
  private readonly pieces: string[] = [];
  private tail: string[] = [];
  private tailChars = 0;
  length = 0;

  append(text: string): void {
    this.tail.push(text);
    this.tailChars += text.length;
    this.length += text.length;
    if (this.tailChars >= pieceChars) this.seal();
  }

  /** The whole text, kept as one piece from then on. */
  toString(): string {
    this.seal();
    if (this.pieces.length > 1) this.pieces.splice(0, this.pieces.length, this.pieces.join(""));
    return this.pieces[0] ?? "";
  }

  private seal(): void {
    if (this.tail.length === 0) return;
    this.pieces.push(this.tail.join(""));
    this.tail = [];
    this.tailChars = 0;
  }
}

/**
 * The start of `text` that fits in `room` code units, not ending between the two halves of a
 * surrogate pair; a copy, so that it does not keep the provider's whole string alive.
 */
export function fitting(text: string, room: number): string {
  if (text.length <= room) return text;
  let end = Math.max(room, 0);
  const last = text.charCodeAt(end - 1);
  if (end > 0 && last >= 0xd800 && last <= 0xdbff) end -= 1;
  return Buffer.from(text.slice(0, end), "utf16le").toString("utf16le");
}
