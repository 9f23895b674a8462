import type { NodeResponse } from "./body.js";

const eventStart = Buffer.from("data: ");
const namedStart = Buffer.from("event: ");
const eventEnd = Buffer.from("\n\n");
const lineEnd = Buffer.from("\n");
const lf = 0x0a;
const cr = 0x0d;

/**
 * The SSE events of one answer. Events that arrive in the same turn of the event loop (one
 * upstream read usually carries many) leave in one write of their bytes as they came, framed: a
 * write per event costs an HTTP chunk and a syscall per event, and turning the bytes back into
 * text costs a copy.
 */
export class EventWriter {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  private written = false;
  /** The last write found the client's socket full: pull nothing more until it drains. */
  blocked = false;

  constructor(private readonly res: NodeResponse) {}

  /**
   * Sends the headers (written by writeHead) by the end of this turn of the event loop: with the
   * first events when they come in it (one write, not two), else alone. Time to first byte is
   * the client's, not the provider's.
   */
  headersSoon(): void {
    setImmediate(sendHeaders, this);
  }

  sendHeaders(): void {
    if (this.written || this.res.writableEnded || this.res.destroyed) return;
    (this.res as { flushHeaders?: () => void }).flushHeaders?.();
  }

  /**
   * Queues one event whose data is `data`, for this turn's write: `data: <bytes>\n\n`, or, when
   * the data holds line breaks (CR, LF or CRLF), one `data:` line per line of it. What a provider
   * sends is data, never framing: written as it came, a line break in it would end the event's
   * line and an empty line the event itself, letting a provider forge events of its own
   * (DESIGN.md 8). A client's SSE parser joins the lines back with LF, the data as it was.
   */
  event(data: Uint8Array, name?: string): void {
    if (this.pending.length === 0) process.nextTick(flushEvents, this);
    if (name !== undefined && name !== "") {
      // A dialect's event name is the gateway's own (its translator's), never a provider's.
      const line = Buffer.from(name);
      this.pending.push(namedStart, line, lineEnd);
      this.pendingBytes += namedStart.byteLength + line.byteLength + lineEnd.byteLength;
    }
    // Two native scans; the line-by-line path is for the rare multi-line event.
    if (data.indexOf(lf) === -1 && data.indexOf(cr) === -1) {
      this.pending.push(eventStart, data, eventEnd);
      this.pendingBytes += eventStart.byteLength + data.byteLength + eventEnd.byteLength;
      return;
    }
    let start = 0;
    for (let i = 0; i < data.byteLength; i++) {
      const byte = data[i];
      if (byte !== lf && byte !== cr) continue;
      this.line(data.subarray(start, i), lineEnd);
      if (byte === cr && data[i + 1] === lf) i++;
      start = i + 1;
    }
    this.line(data.subarray(start), eventEnd);
  }

  private line(text: Uint8Array, end: Buffer): void {
    this.pending.push(eventStart, text, end);
    this.pendingBytes += eventStart.byteLength + text.byteLength + end.byteLength;
  }

  flush(): void {
    if (this.pending.length === 0) return;
    const parts = this.pending;
    const size = this.pendingBytes;
    this.pending = [];
    this.pendingBytes = 0;
    if (this.res.writableEnded || this.res.destroyed) return;
    this.written = true;
    if (!this.res.write(Buffer.concat(parts, size))) this.blocked = true;
  }

  /**
   * Resolves when the client has taken what was written (`drain`) or is gone (`close`: it left,
   * or the listener cut it after CLIENT_WRITE_TIMEOUT_MS without taking a byte). Only called
   * when a write said the socket is full, so a client that keeps up costs nothing here.
   */
  async drained(): Promise<void> {
    const res = this.res;
    // It may have drained already, between the write and now: a wait for a `drain` that
    // already came would never end.
    if (!res.destroyed && !res.writableEnded && needsDrain(res)) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          res.off("drain", done);
          res.off("close", done);
          resolve();
        };
        res.on("drain", done);
        res.on("close", done);
      });
    }
    this.blocked = false;
  }

  /** Writes what is queued, then `last`, and ends the response. */
  end(last: string): void {
    this.flush();
    this.written = true;
    this.res.end(last);
  }
}

/** Whether the response's writer was told to wait for `drain` and it has not come yet. */
function needsDrain(res: NodeResponse): boolean {
  // HTTP/2's compatibility response has no writableNeedDrain of its own; its stream does.
  const own = (res as { writableNeedDrain?: boolean }).writableNeedDrain;
  if (own !== undefined) return own;
  return (res as { stream?: { writableNeedDrain?: boolean } }).stream?.writableNeedDrain === true;
}

function flushEvents(writer: EventWriter): void {
  writer.flush();
}

function sendHeaders(writer: EventWriter): void {
  writer.sendHeaders();
}
