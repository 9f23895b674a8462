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
