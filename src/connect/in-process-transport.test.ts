import {
  Code,
  ConnectError,
  createContextKey,
  type HandlerContext,
  type Interceptor,
} from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { createInProcessCaller } from "./in-process-transport.js";

const who = createContextKey<string>("nobody");
const never = new AbortController().signal;

describe("in-process caller", () => {
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
    let seen = "";
    const caller = createInProcessCaller(
      [
        {
          service: InferenceService,
          impl: {
            getRequest: (req: { id: string }, ctx: HandlerContext) => {
              order.push("impl");
              seen = ctx.values.get(who);
              return { request: { id: req.id } };
            },
          },
        },
      ],
      [tag("outer"), tag("auth")],
    );
    const headers = { authorization: "Bearer k", "x-other": ["a", "b"] };
    const res = await caller.unary(
      InferenceService.method.getRequest,
      { id: "abc" },
      { headers, signal: never },
    );
    // A message (defaults filled), whatever shape the implementation returned.
    expect(res.request?.id).toBe("abc");
    expect(res.request?.model).toBe("");
    expect(order).toEqual(["outer>", "auth>", "impl", "<auth", "<outer"]);
    expect(seen).toBe("Bearer k");
  });

  it("lets interceptors read the caller's headers in place and change them without touching the caller's", async () => {
    const headers: Record<string, string | string[]> = {
      authorization: "Bearer k",
      "x-many": ["a", "b"],
    };
    let read: Record<string, unknown> = {};
    const caller = createInProcessCaller(
      [{ service: InferenceService, impl: { getRequest: () => ({}) } }],
      [
        (next) => async (req) => {
          read = {
            auth: req.header.get("Authorization"),
            many: req.header.get("x-many"),
            missing: req.header.get("x-missing"),
            has: req.header.has("authorization"),
          };
          req.header.set("authorization", "Bearer other");
          read.after = req.header.get("authorization");
          read.all = [...req.header].map(([k]) => k);
          return next(req);
        },
      ],
    );
    await caller.unary(InferenceService.method.getRequest, { id: "x" }, { headers, signal: never });
    expect(read).toEqual({
      auth: "Bearer k",
      many: "a, b",
      missing: null,
      has: true,
      after: "Bearer other",
      all: ["authorization", "x-many"],
    });
    expect(headers.authorization).toBe("Bearer k");
  });

  it("streams the implementation's messages in order, ends it when the caller stops reading, and passes the caller's signal", async () => {
    let aborted: unknown;
    let finished = false;
    let input: unknown;
    const caller = createInProcessCaller(
      [
        {
          service: InferenceService,
          impl: {
            streamChatCompletion: async function* (
              req: { permitId: string },
              ctx: HandlerContext,
            ): AsyncGenerator<object> {
              input = req.permitId;
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
    const method = InferenceService.method.streamChatCompletion;
    const all: string[] = [];
    const messages = await caller.stream(
      method,
      { body: new Uint8Array(), permitId: "p1" },
      { headers: {}, signal: never },
    );
    for await (const m of messages) {
      if (m.event.case === "chunk") all.push(new TextDecoder().decode(m.event.value.data));
    }
    expect(input).toBe("p1");
    expect(all).toEqual(["0", "1", "2", "3", "4"]);
    expect(aborted).toBeUndefined();

    // A caller that stops reading ends the implementation's generator.
    finished = false;
    const it = (
      await caller.stream(method, { body: new Uint8Array() }, { headers: {}, signal: never })
    )[Symbol.asyncIterator]();
    await it.next();
    await it.return?.();
    expect(finished).toBe(true);
    expect(aborted).toBeUndefined();

    // The caller's signal reaches the implementation's context.
    const left = new AbortController();
    for await (const m of await caller.stream(
      method,
      { body: new Uint8Array() },
      { headers: {}, signal: left.signal },
    )) {
      if (m.event.case === "chunk") left.abort(new Error("client left"));
    }
    expect((aborted as Error).message).toBe("client left");
  });

  it("answers unimplemented for a method without an implementation, through the interceptors", async () => {
    const seen: string[] = [];
    const caller = createInProcessCaller(
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
    const error = await caller
      .unary(CatalogService.method.listModels, {}, { headers: {}, signal: never })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.Unimplemented);
    expect(seen).toEqual(["unimplemented"]);
  });
});
