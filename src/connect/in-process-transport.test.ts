import {
  Code,
  ConnectError,
  createClient,
  createContextKey,
  type HandlerContext,
  type Interceptor,
} from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { createInProcessTransport } from "./in-process-transport.js";

const who = createContextKey<string>("nobody");

describe("in-process transport", () => {
  it("runs the interceptors outermost first around the implementation, sharing context values and headers", async () => {
    const order: string[] = [];
    const tag =
      (name: string): Interceptor =>
      (next) =>
      async (req) => {
        order.push(`${name}>`);
        if (name === "auth") req.contextValues.set(who, req.header.get("authorization") ?? "");
        const res = await next(req);
        order.push(`<${name}`);
        return res;
      };
    const transport = createInProcessTransport(
      [
        {
          service: InferenceService,
          impl: {
            getRequest: (req: { id: string }) => {
              order.push("impl");
              return { request: { id: req.id } };
            },
          },
        },
      ],
      [tag("outer"), tag("auth")],
    );
    // The implementation sees what an interceptor stored, through its HandlerContext.
    let seen = "";
    const t2 = createInProcessTransport(
      [
        {
          service: InferenceService,
          impl: {
            getRequest: (req: { id: string }, ctx: HandlerContext) => {
              seen = ctx.values.get(who);
              ctx.responseHeader.set("x-done", "yes");
              return { request: { id: req.id } };
            },
          },
        },
      ],
      [tag("auth")],
    );
    const client = createClient(InferenceService, transport);
    const res = await client.getRequest({ id: "abc" });
    expect(res.request?.id).toBe("abc");
    expect(order).toEqual(["outer>", "auth>", "impl", "<auth", "<outer"]);

    let header: Headers | undefined;
    await createClient(InferenceService, t2).getRequest(
      { id: "x" },
      { headers: { authorization: "Bearer k" }, onHeader: (h) => (header = h) },
    );
    expect(seen).toBe("Bearer k");
    expect(header?.get("x-done")).toBe("yes");
  });

  it("streams the implementation's messages in order, ends it when the caller stops reading, and passes the caller's signal", async () => {
    let aborted: unknown;
    let finished = false;
    const transport = createInProcessTransport(
      [
        {
          service: InferenceService,
          impl: {
            streamChatCompletion: async function* (
              _req: unknown,
              ctx: HandlerContext,
            ): AsyncGenerator<object> {
              ctx.signal.addEventListener("abort", () => (aborted = ctx.signal.reason));
              try {
                for (let i = 0; i < 5; i++) {
                  yield {
                    event: { case: "chunk", value: { data: new TextEncoder().encode(`${i}`) } },
                  };
                }
              } finally {
                finished = true;
              }
            },
          },
        },
      ],
      [],
    );
    const client = createClient(InferenceService, transport);
    const all: string[] = [];
    for await (const m of client.streamChatCompletion({ body: new Uint8Array() })) {
      if (m.event.case === "chunk") all.push(new TextDecoder().decode(m.event.value.data));
    }
    expect(all).toEqual(["0", "1", "2", "3", "4"]);
    expect(aborted).toBeUndefined();

    // A caller that stops reading (the promise client offers only its signal for that; the
    // transport's own iterable has return()) ends the implementation's generator.
    const res = await transport.stream(
      InferenceService.method.streamChatCompletion,
      undefined,
      undefined,
      undefined,
      (async function* () {
        yield { body: new Uint8Array() };
      })(),
    );
    const it = res.message[Symbol.asyncIterator]();
    await it.next();
    await it.return?.();
    expect(finished).toBe(true);
    expect(aborted).toBeUndefined();

    // The caller's signal reaches the implementation's context.
    aborted = undefined;
    const caller = new AbortController();
    const read = (async () => {
      for await (const m of client.streamChatCompletion(
        { body: new Uint8Array() },
        { signal: caller.signal },
      )) {
        if (m.event.case === "chunk") caller.abort(new Error("client left"));
      }
    })();
    await read.catch(() => undefined);
    expect((aborted as Error).message).toBe("client left");
  });

  it("answers unimplemented for a method without an implementation, through the interceptors", async () => {
    const seen: string[] = [];
    const transport = createInProcessTransport(
      [{ service: CatalogService, impl: {} }],
      [
        (next) => async (req) => {
          try {
            return await next(req);
          } catch (error) {
            seen.push((error as ConnectError).code === Code.Unimplemented ? "unimplemented" : "?");
            throw error;
          }
        },
      ],
    );
    const error = await createClient(CatalogService, transport)
      .listModels({})
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.Unimplemented);
    expect(seen).toEqual(["unimplemented"]);
  });
});
