import { create, toBinary } from "@bufbuild/protobuf";
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import type { Hex } from "viem";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  InferenceService,
  StreamChatCompletionRequestSchema,
} from "../../gen/gateway/v1/inference_pb.js";
import { demoTariff } from "../../src/dev/demo-market.js";
import { priceCredits } from "../../src/domain/pricing.js";
import { describeIfPostgres } from "../helpers/db.js";
import type { FakeUpstream } from "../helpers/fake-upstream.js";
import { openPermit } from "../helpers/market.js";
import { serveProcess, stopProcess, type GatewayProcess } from "../helpers/processes.js";
import { authed, eventually, json, startChatStack, type TestStack } from "../helpers/stack.js";
import { demoChatCounter, promptTokens } from "../helpers/token-counts.js";

/**
 * Slow readers cost bounded memory (DESIGN.md 8, issue 18): an endless provider and a client
 * that sends its request and then stops reading at the TCP level, against `gateway serve` as
 * its own process (so its RSS is the gateway's alone). The relay reads the provider no faster
 * than the client takes the answer, so the provider is paused (what it managed to write stops
 * growing) and the gateway's RSS stays flat; after CLIENT_WRITE_TIMEOUT_MS without a byte taken
 * the client is cut as a cancellation: `cancelled`, `partial`, input plus delivered output.
 */

const writeTimeoutMs = 4000;
/** RSS growth allowed over the warmed-up baseline while the client is paused (measured: ~1-3 MiB). */
const rssBound = 48 * 1024 * 1024;

function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)![1]) * 1024;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describeIfPostgres("slow readers against an endless provider (gateway serve)", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let child: GatewayProcess | undefined;
  let permitId: Hex;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack({}, { chunks: 3 }));
    permitId = await openPermit(stack, { deposit: 10n ** 24n });
    child = await serveProcess(stack, { CLIENT_WRITE_TIMEOUT_MS: String(writeTimeoutMs) });
  }, 90_000);
  afterAll(async () => {
    await stopProcess(child);
    await fake?.stop();
    await stack?.close();
  });

  const body = (stream: boolean) =>
    JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "never read" }],
      stream,
      // Far above what the endless provider writes here: its text is runs of one letter, which
      // the gateway counts by their bytes (output-tally.ts, countText), and it must not be cut.
      max_tokens: 100_000_000,
    });

  /**
   * The input the gateway charges a cancelled stream without provider usage: its own count of the
   * prompt (the demo model's tokenizer through its chat template).
   */
  async function promptCount(): Promise<bigint> {
    return promptTokens(await demoChatCounter(), JSON.parse(body(true)));
  }

  /** The gateway's RSS now, after one ordinary streamed chat (JIT, pools and buffers warm). */
  async function baseline(): Promise<number> {
    fake.setOptions({ endless: false });
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${child!.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${stack.apiKey}`,
          "content-type": "application/json",
          "x-gateway-permit": permitId,
        },
        body: body(true).replace("1000000", "16"),
      });
      await res.text();
    }
    await sleep(300);
    return rssOf(child!.child.pid!);
  }

  /**
   * While the client is paused: samples RSS and the provider's written bytes until the cut.
   * Returns the largest RSS growth, and the provider's bytes at 1.5 s and just before the
   * timeout (equal when it is paused).
   */
  async function watchPaused(base: number, since: number) {
    let peak = 0;
    let early = 0;
    while (performance.now() - since < writeTimeoutMs - 500) {
      peak = Math.max(peak, rssOf(child!.child.pid!) - base);
      if (early === 0 && performance.now() - since > 1500) early = fake.streamedBytes;
      await sleep(100);
    }
    return { peak, early, late: fake.streamedBytes };
  }

  /** The ids of the permit's requests so far (the warm-up chats'). */
  async function requestsSoFar(): Promise<Set<string>> {
    const { rows } = await stack.database.db.pool.query<{ id: string }>(
      "SELECT id FROM inference_requests WHERE permit_id = $1",
      [permitId.toLowerCase()],
    );
    return new Set(rows.map((r) => r.id));
  }

  /** The record of the one request made since `before`, once it is closed. */
  async function recordAfterCut(before: Set<string>) {
    let id = "";
    await eventually(
      async () => {
        const { rows } = await stack.database.db.pool.query<{ id: string; status: string }>(
          "SELECT id, status FROM inference_requests WHERE permit_id = $1",
          [permitId.toLowerCase()],
        );
        const mine = rows.filter((r) => !before.has(r.id));
        if (mine.length !== 1 || ["pending", "streaming"].includes(mine[0]!.status)) return false;
        id = mine[0]!.id;
        return true;
      },
      15_000,
      50,
    );
    return (await json(await authed(stack, `/v1/requests/${id}`))) as {
      status: string;
      billing: string;
      input_tokens: string;
      output_tokens: string;
      credits_charged: string;
      error: string;
    };
  }

  it("REST SSE: a client paused at the TCP level pauses the provider, RSS stays bounded, and the client is cut after CLIENT_WRITE_TIMEOUT_MS as cancelled/partial, charged input + delivered output", async () => {
    const base = await baseline();
    const before = await requestsSoFar();
    const bound = await promptCount();
    fake.setOptions({ endless: true });
    const bytesBefore = fake.streamedBytes;
    const { port } = new URL(child!.url);
    const socket = net.connect(Number(port), "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    const payload = body(true);
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer ${stack.apiKey}\r\n` +
        `x-gateway-permit: ${permitId}\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`,
    );
    // Not a byte read: the kernel's buffers fill, then the gateway's socket.
    socket.pause();
    const since = performance.now();
    const closed = new Promise((resolve) => socket.once("close", resolve));
    const paused = await watchPaused(base, since);
    console.log(
      `REST SSE paused: RSS growth ${(paused.peak / 2 ** 20).toFixed(1)} MiB, provider wrote ${((paused.late - bytesBefore) / 2 ** 20).toFixed(1)} MiB (${paused.late - paused.early} bytes in the last ${((writeTimeoutMs - 2000) / 1000).toFixed(1)} s)`,
    );
    expect(paused.peak).toBeLessThan(rssBound);
    // The provider is paused: nothing more written in the last seconds before the cut, and what
    // it managed to write (socket buffers on the way) is bounded.
    expect(paused.late - paused.early).toBe(0);
    expect(paused.late - bytesBefore).toBeLessThan(32 * 1024 * 1024);

    // Still paused, the client is cut: its record closes.
    const record = await recordAfterCut(before);
    const cutAfter = performance.now() - since;
    expect(cutAfter).toBeGreaterThanOrEqual(writeTimeoutMs - 100);
    expect(cutAfter).toBeLessThan(writeTimeoutMs + 5000);
    // What reached the client (the gateway's kernel buffer still flushes), then the end.
    let received = "";
    socket.setEncoding("utf8");
    socket.on("data", (text: string) => (received += text));
    socket.on("error", () => undefined);
    socket.resume();
    await closed;
    const output = BigInt(record.output_tokens);
    const chunksReceived = BigInt(
      received.split("\n").filter((l) => l.startsWith("data: {")).length,
    );
    expect(record).toMatchObject({
      status: "cancelled",
      billing: "partial",
      input_tokens: bound.toString(),
      error: "client disconnected",
    });
    // Charged input plus the output delivered: at least what reached the client, at most what the
    // provider wrote.
    expect(output).toBeGreaterThanOrEqual(chunksReceived);
    // The gateway's count: at most the bytes the provider wrote (no token is shorter).
    expect(output).toBeLessThanOrEqual(BigInt(fake.streamedBytes));
    expect(record.credits_charged).toBe(
      priceCredits(demoTariff, { inputTokens: bound, outputTokens: output }, false).toString(),
    );
    // The provider saw the cancellation.
    expect(await fake.requests.at(-1)!.finished).toBe("aborted");
  }, 60_000);

  it("gRPC: an HTTP/2 client that stops reading pauses the provider through flow control, RSS stays bounded, and the stream is cut after CLIENT_WRITE_TIMEOUT_MS as cancelled/partial", async () => {
    const base = await baseline();
    const before = await requestsSoFar();
    const bound = await promptCount();
    fake.setOptions({ endless: true });
    const bytesBefore = fake.streamedBytes;
    const session = http2.connect(child!.url);
    const message = toBinary(
      StreamChatCompletionRequestSchema,
      create(StreamChatCompletionRequestSchema, {
        body: new TextEncoder().encode(body(true)),
        permitId,
      }),
    );
    const frame = Buffer.alloc(5 + message.byteLength);
    frame.writeUInt32BE(message.byteLength, 1);
    frame.set(message, 5);
    const stream = session.request({
      ":method": "POST",
      ":path": `/${InferenceService.typeName}/${InferenceService.method.streamChatCompletion.name}`,
      "content-type": "application/grpc+proto",
      te: "trailers",
      authorization: `Bearer ${stack.apiKey}`,
    });
    stream.end(frame);
    // The first bytes arrive, then the client reads nothing more: its stream's flow-control
    // window closes, and so does the connection's.
    await new Promise((resolve) => stream.once("data", resolve));
    stream.pause();
    const since = performance.now();
    const closed = new Promise((resolve) => stream.once("close", resolve));
    const paused = await watchPaused(base, since);
    console.log(
      `gRPC paused: RSS growth ${(paused.peak / 2 ** 20).toFixed(1)} MiB, provider wrote ${((paused.late - bytesBefore) / 2 ** 20).toFixed(1)} MiB (${paused.late - paused.early} bytes in the last ${((writeTimeoutMs - 2000) / 1000).toFixed(1)} s)`,
    );
    expect(paused.peak).toBeLessThan(rssBound);
    expect(paused.late - paused.early).toBe(0);
    expect(paused.late - bytesBefore).toBeLessThan(32 * 1024 * 1024);

    const record = await recordAfterCut(before);
    const cutAfter = performance.now() - since;
    expect(cutAfter).toBeGreaterThanOrEqual(writeTimeoutMs - 100);
    expect(cutAfter).toBeLessThan(writeTimeoutMs + 5000);
    // The gateway reset the stream: the client sees it end.
    stream.on("data", () => undefined);
    stream.on("error", () => undefined);
    stream.resume();
    await closed;
    session.destroy();
    const output = BigInt(record.output_tokens);
    expect(record).toMatchObject({
      status: "cancelled",
      billing: "partial",
      input_tokens: bound.toString(),
    });
    expect(output).toBeGreaterThan(0n);
    // The gateway's count: at most the bytes the provider wrote (no token is shorter).
    expect(output).toBeLessThanOrEqual(BigInt(fake.streamedBytes));
    expect(record.credits_charged).toBe(
      priceCredits(demoTariff, { inputTokens: bound, outputTokens: output }, false).toString(),
    );
    expect(await fake.requests.at(-1)!.finished).toBe("aborted");
  }, 60_000);
});

/**
 * REST JSON: the answer is read whole from the provider (at most 8 MiB) before it is written,
 * then written in 64 KiB pieces, so a client that reads it slowly is seen taking it and is not
 * cut, while one that takes nothing is cut after CLIENT_WRITE_TIMEOUT_MS (its answer, complete
 * when it was handed over, is billed).
 */
describe("slow readers of a big JSON answer", () => {
  const timeoutMs = 500;
  let stack: TestStack;
  let fake: FakeUpstream;

  beforeAll(async () => {
    // About 6 MiB of answer: more than the kernel's socket buffers hold.
    ({ stack, fake } = await startChatStack(
      { CLIENT_WRITE_TIMEOUT_MS: String(timeoutMs) },
      { chunks: 600_000 },
    ));
  }, 60_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  /** Requests whose answer the gateway has (closed: charged or voided). */
  async function closedRequests(): Promise<number> {
    const { rows } = await stack.database.db.pool.query<{ n: string }>(
      "SELECT count(*) AS n FROM inference_requests WHERE status NOT IN ('pending', 'streaming')",
    );
    return Number(rows[0]!.n);
  }

  /** Sends a JSON chat on a raw socket that reads nothing yet. */
  async function rawJsonChat(): Promise<net.Socket> {
    const { port } = new URL(stack.gateway.url);
    const socket = net.connect(Number(port), "127.0.0.1");
    await new Promise((resolve) => socket.once("connect", resolve));
    const payload = JSON.stringify({
      model: "demo-chat",
      messages: [{ role: "user", content: "a big answer" }],
      // Room for the 600,000 words (about 4 million tokens; a text this long is counted by its bytes, 6.6 million): the gateway cuts at the priced limit.
      max_tokens: 10_000_000,
    });
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer ${stack.apiKey}\r\n` +
        `x-gateway-permit: ${stack.demo.permitId}\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`,
    );
    socket.pause();
    socket.on("error", () => undefined);
    return socket;
  }

  /** The response head and body length of everything `socket` delivers until it closes. */
  function readAll(socket: net.Socket, bursts: boolean) {
    const chunks: Buffer[] = [];
    socket.on("data", (chunk: Buffer) => chunks.push(chunk));
    let open = true;
    const closed = new Promise<void>((resolve) =>
      socket.once("close", () => {
        open = false;
        resolve();
      }),
    );
    return (async () => {
      if (!bursts) socket.resume();
      // Bursts of 5 ms every 150 ms (less than the timeout) until the whole answer came.
      while (bursts && open) {
        socket.resume();
        await sleep(5);
        socket.pause();
        await sleep(145);
        const text = Buffer.concat(chunks).toString("latin1");
        const head = text.indexOf("\r\n\r\n");
        const length = /content-length: (\d+)/i.exec(text)?.[1];
        if (head !== -1 && length !== undefined && text.length - head - 4 >= Number(length)) break;
      }
      if (!bursts) await closed;
      const text = Buffer.concat(chunks).toString("latin1");
      const head = text.indexOf("\r\n\r\n");
      return {
        length: Number(/content-length: (\d+)/i.exec(text)?.[1]),
        body: head === -1 ? 0 : text.length - head - 4,
        closed: !open,
      };
    })();
  }

  it("a client that reads the answer in short bursts gets all of it", async () => {
    const socket = await rawJsonChat();
    const got = await readAll(socket, true);
    expect(got.length).toBeGreaterThan(6 * 1024 * 1024);
    expect(got.body).toBe(got.length);
    expect(got.closed).toBe(false); // kept alive, never cut
    socket.destroy();
  }, 60_000);

  it("a client that reads nothing is cut after CLIENT_WRITE_TIMEOUT_MS, the answer unfinished", async () => {
    const closedBefore = await closedRequests();
    const socket = await rawJsonChat();
    // Paused until the gateway has its answer (metering 6 MiB exactly takes longer than the
    // timeout: the test paused a fixed 4 timeouts, and the answer came after the client resumed)
    // and well past the timeout after that, then it reads what reached it: the gateway has
    // closed the connection before the answer's end.
    while ((await closedRequests()) === closedBefore) await sleep(100);
    await sleep(timeoutMs * 4);
    const got = await readAll(socket, false);
    expect(got.closed).toBe(true);
    expect(got.length).toBeGreaterThan(6 * 1024 * 1024);
    expect(got.body).toBeLessThan(got.length);
  }, 60_000);
});
