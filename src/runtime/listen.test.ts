import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { listen, type Listener } from "./listen.js";

/**
 * CLIENT_WRITE_TIMEOUT_MS (DESIGN.md 8, issue 18): a response whose client takes none of its
 * waiting bytes for the timeout is destroyed, streaming or ended; a client that reads slowly
 * is never cut; a writer waiting for `drain` (as connect-node's stream writes do) is woken.
 */

const timeoutMs = 400;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

type Res = http.ServerResponse | http2.Http2ServerResponse;
/** One write signature for both (the union's overloads are not callable as one). */
const writeOn = (res: Res, data: Buffer, cb?: (err?: Error | null) => void): boolean =>
  (res as http.ServerResponse).write(data, cb);

/** Writes 16 KiB pieces for as long as the response lives, waiting for `drain` as it should. */
function writeForever(res: Res, wrote: { bytes: number }): void {
  const piece = Buffer.alloc(16 * 1024, 0x61);
  const next = (): void => {
    while (!res.destroyed) {
      wrote.bytes += piece.byteLength;
      if (!writeOn(res, piece)) {
        res.once("drain", next);
        return;
      }
    }
  };
  next();
}

describe("client write timeout", () => {
  let listener: Listener | undefined;
  afterEach(async () => {
    await listener?.close(0);
    listener = undefined;
  });

  /** A listener whose every response is given to `handle`; resolves each response's close time. */
  async function serve(handle: (res: Res) => void, clientWriteTimeoutMs = timeoutMs) {
    const closes: { at: number; finished: boolean }[] = [];
    listener = await listen(
      (_req, res) => {
        res.once("close", () =>
          closes.push({ at: performance.now(), finished: res.writableFinished }),
        );
        res.writeHead(200, { "content-type": "application/octet-stream" });
        handle(res);
      },
      { host: "127.0.0.1", port: 0, limits: { clientWriteTimeoutMs } },
    );
    return { port: listener.port, closes };
  }

  /** An HTTP/1 client that sends a request and then reads nothing. */
  async function pausedClient(port: number): Promise<net.Socket> {
    const socket = net.connect(port, "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    socket.write("GET / HTTP/1.1\r\nhost: test\r\n\r\n");
    socket.pause();
    socket.on("error", () => undefined);
    return socket;
  }

  it("HTTP/1: a streaming response whose client reads nothing is destroyed once the kernel's buffers are full and the timeout passed with nothing taken", async () => {
    const wrote = { bytes: 0 };
    const { port, closes } = await serve((res) => writeForever(res, wrote));
    const since = performance.now();
    const socket = await pausedClient(port);
    while (closes.length === 0 && performance.now() - since < 20_000) await sleep(50);
    expect(closes).toHaveLength(1);
    expect(closes[0]!.finished).toBe(false);
    expect(closes[0]!.at - since).toBeGreaterThanOrEqual(timeoutMs);
    // The writer stopped when its socket was full: what it wrote is the buffers' worth, bounded.
    expect(wrote.bytes).toBeLessThan(64 * 1024 * 1024);
    socket.destroy();
  });

  it("HTTP/1: an ended response still flushing to a client that reads nothing is destroyed too", async () => {
    const total = 48 * 1024 * 1024;
    const { port, closes } = await serve((res) => res.end(Buffer.alloc(total, 0x62)));
    const socket = await pausedClient(port);
    const since = performance.now();
    while (closes.length === 0 && performance.now() - since < 20_000) await sleep(50);
    expect(closes).toHaveLength(1);
    expect(closes[0]!.at - since).toBeGreaterThanOrEqual(timeoutMs - 50);
    // The client gets what the kernel held, then the end: not the whole answer.
    let received = 0;
    socket.on("data", (chunk: Buffer) => (received += chunk.byteLength));
    const ended = new Promise((resolve) => socket.once("close", resolve));
    socket.resume();
    await ended;
    expect(received).toBeLessThan(total);
  });

  it("HTTP/1: a client that reads slowly, but reads, is never cut", async () => {
    const total = 128 * 1024 * 1024;
    const wrote = { bytes: 0 };
    // A writer that waits for drain (as the SSE relay does) and stops after `total`.
    const { port, closes } = await serve((res) => {
      const piece = Buffer.alloc(64 * 1024, 0x63);
      const next = (): void => {
        while (!res.destroyed && wrote.bytes < total) {
          wrote.bytes += piece.byteLength;
          if (!writeOn(res, piece)) {
            res.once("drain", next);
            return;
          }
        }
        if (!res.destroyed && !res.writableEnded) res.end();
      };
      next();
      // Pauses of 180 ms against a timeout ten times as long: on a loaded machine a timer can
      // fire hundreds of ms late, and this test is about pauses, not about the timeout's edge.
    }, 2_000);
    const socket = await pausedClient(port);
    let received = 0;
    socket.on("data", (chunk: Buffer) => (received += chunk.byteLength));
    const started = performance.now();
    // Reads in short bursts, 20 ms every 200 ms: pauses shorter than the timeout, many of them.
    let pauses = 0;
    while (received < total && !socket.destroyed && performance.now() - started < 60_000) {
      socket.resume();
      await sleep(20);
      socket.pause();
      await sleep(180);
      pauses++;
    }
    expect(pauses).toBeGreaterThanOrEqual(4);
    expect(received).toBeGreaterThan(total); // the body and the response head
    await sleep(50);
    expect(closes).toEqual([{ at: expect.any(Number), finished: true }]);
    socket.destroy();
  }, 70_000);

  it("HTTP/2: a stream whose client stops reading is reset after the timeout, and a writer waiting for drain is woken to find it gone", async () => {
    let failed: string | undefined;
    const { port, closes } = await serve((res) => {
      // As connect-node writes a stream: each write awaits `drain`, `error` or its callback.
      void (async () => {
        const piece = Buffer.alloc(16 * 1024, 0x64);
        try {
          for (;;) {
            await new Promise<void>((resolve, reject) => {
              const flushed = writeOn(res, piece, (err) => {
                if (err && !flushed) reject(err);
              });
              if (flushed) resolve();
              else res.once("drain", resolve);
            });
          }
        } catch (error) {
          failed = (error as NodeJS.ErrnoException).code;
        }
      })();
    });
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => undefined);
    const stream = session.request({ ":path": "/" });
    stream.on("error", () => undefined);
    stream.end();
    await new Promise((resolve) => stream.once("data", resolve));
    stream.pause();
    const since = performance.now();
    while ((closes.length === 0 || failed === undefined) && performance.now() - since < 20_000)
      await sleep(50);
    expect(closes).toHaveLength(1);
    expect(closes[0]!.finished).toBe(false);
    expect(closes[0]!.at - since).toBeGreaterThanOrEqual(timeoutMs);
    expect(failed).toBe("ERR_HTTP2_INVALID_STREAM");
    session.destroy();
  });
});
