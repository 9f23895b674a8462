import { execFile } from "node:child_process";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CatalogService } from "../gen/gateway/v1/catalog_pb.js";
import { ModelStatus } from "../gen/gateway/v1/market_pb.js";
import { marketAbi } from "../gen/contracts/artifacts.js";
import { demoMetadata, demoTariff, id32 } from "../src/dev/demo-market.js";
import { grpcClient, grpcUnary } from "./helpers/grpc.js";
import { authed, eventually, json, startTestStack, type TestStack } from "./helpers/stack.js";

const run = promisify(execFile);

const modelFields = [
  "id",
  "object",
  "model_id",
  "repository",
  "revision",
  "task",
  "creator",
  "credit_token",
  "pool_id",
  "position_token_id",
  "provider_count",
  "status",
  "credit_token_decimals",
  "credit_token_symbol",
];
const offerFields = [
  "offer_id",
  "model_id",
  "operator",
  "payout",
  "status",
  "tariff_version",
  "capabilities",
  "verified_at",
  "verification_expires_at",
  "region",
  "hardware",
  "max_concurrency",
];

describe("catalog", () => {
  let stack: TestStack;
  beforeAll(async () => {
    stack = await startTestStack();
  });
  afterAll(async () => {
    await stack?.close();
  });

  describe("authentication and errors", () => {
    it("serves /health without credentials", async () => {
      const res = await fetch(`${stack.gateway.url}/health`);
      expect(res.status).toBe(200);
      expect(await json(res)).toEqual({ status: "ok" });
    });

    it("reports readiness of database and chain", async () => {
      const res = await fetch(`${stack.gateway.url}/ready`);
      expect(res.status).toBe(200);
      expect(await json(res)).toMatchObject({
        checks: { database: { ok: true }, chain: { ok: true } },
      });
    });

    it("answers 401 missing_api_key without a key", async () => {
      const res = await fetch(`${stack.gateway.url}/v1/models`);
      expect(res.status).toBe(401);
      expect(await json(res)).toEqual({
        error: {
          code: "missing_api_key",
          type: "authentication_error",
          message: expect.any(String),
        },
      });
    });

    it("answers 401 invalid_api_key with a wrong key", async () => {
      const res = await fetch(`${stack.gateway.url}/v1/models`, {
        headers: { authorization: "Bearer gw_wrong" },
      });
      expect(res.status).toBe(401);
      expect((await json(res)).error.code).toBe("invalid_api_key");
    });

    it("answers unknown routes and methods with the error body", async () => {
      const missing = await authed(stack, "/v1/nothing");
      expect(missing.status).toBe(404);
      expect((await json(missing)).error.code).toBe("route_not_found");
      const wrongMethod = await authed(stack, "/v1/models", { method: "DELETE" });
      expect(wrongMethod.status).toBe(405);
      expect((await json(wrongMethod)).error.type).toBe("invalid_request_error");
    });

    it("answers a flush with 503 settlement_unavailable when the gateway has no settlement key", async () => {
      const res = await authed(stack, "/settlements/flush", {
        method: "POST",
        headers: { authorization: `Bearer ${stack.operatorToken}` },
      });
      expect(res.status).toBe(503);
      expect((await json(res)).error).toMatchObject({
        code: "settlement_unavailable",
        type: "service_unavailable",
      });
    });

    it("keeps the API key out of the logs and puts a request id on every request line", async () => {
      const res = await authed(stack, "/v1/models", {
        headers: { "x-request-id": "req-log-check-1" },
      });
      expect(res.headers.get("x-request-id")).toBe("req-log-check-1");
      const lines = stack.logs.lines.filter((l) => l.includes("req-log-check-1"));
      expect(lines.length).toBeGreaterThan(0);
      expect(stack.logs.text).not.toContain(stack.apiKey);
      expect(stack.logs.text).not.toContain(stack.operatorToken);
    });
  });

  describe("REST", () => {
    it("lists the demo models with every spec field", async () => {
      const res = await authed(stack, "/v1/models");
      expect(res.status).toBe(200);
      const body = await json(res);
      expect(body.object).toBe("list");
      expect(body.data.map((m: { id: string }) => m.id).sort()).toEqual([
        "demo-chat",
        "demo-coder",
      ]);
      const chat = body.data.find((m: { id: string }) => m.id === "demo-chat");
      for (const field of modelFields) expect(chat).toHaveProperty(field);
      expect(chat).not.toHaveProperty("offers");
      expect(chat).toMatchObject({
        object: "model",
        model_id: stack.demo.models[0]!.modelId,
        repository: "demo/chat-small",
        revision: "v1",
        task: "chat",
        creator: stack.roles.creator.address.toLowerCase(),
        credit_token: stack.demo.models[0]!.creditToken.toLowerCase(),
        // Beside the base units every amount is in: the token's own decimals and symbol.
        credit_token_decimals: 18,
        credit_token_symbol: "DCHAT",
        position_token_id: "1",
        provider_count: 1, // one active, one paused offer
        status: "active",
      });
      expect(chat.pool_id).toMatch(/^0x[0-9a-f]{64}$/);
    });

    it("finds a model by public id, ModelID in either case, and alias, with its offers", async () => {
      const modelId = stack.demo.models[0]!.modelId;
      const refs = [
        "demo-chat",
        modelId.toLowerCase(),
        `0x${modelId.slice(2).toUpperCase()}`,
        "chat",
        "demo%2Fchat",
      ];
      const bodies = [];
      for (const ref of refs) {
        const res = await authed(stack, `/v1/models/${ref}`);
        expect(res.status, ref).toBe(200);
        bodies.push(await json(res));
      }
      for (const body of bodies) expect(body).toEqual(bodies[0]);
      const offers = bodies[0].offers;
      expect(offers).toHaveLength(2);
      for (const offer of offers)
        for (const field of offerFields) expect(offer).toHaveProperty(field);
      const active = offers.find((o: { status: string }) => o.status === "active");
      expect(active).toMatchObject({
        model_id: modelId,
        operator: stack.roles.operator.address.toLowerCase(),
        payout: stack.roles.operator.address.toLowerCase(),
        tariff_version: "1",
        capabilities: { max_output_tokens: 4096, context_window: 8192, streaming: true },
        region: "eu-west",
        hardware: "cpu",
        max_concurrency: 8,
        verified_at: null,
        verification_expires_at: null,
      });
      expect(offers.map((o: { status: string }) => o.status).sort()).toEqual(["active", "paused"]);
    });

    it("answers 404 model_not_found for an unknown model", async () => {
      for (const ref of ["no-such-model", id32("nothing")]) {
        const res = await authed(stack, `/v1/models/${ref}`);
        expect(res.status).toBe(404);
        expect(await json(res)).toEqual({
          error: { code: "model_not_found", type: "not_found_error", message: expect.any(String) },
        });
      }
    });

    it("lists a model's offers, optionally filtered by status", async () => {
      const all = await json(await authed(stack, "/v1/models/demo-chat/offers"));
      expect(all.object).toBe("list");
      expect(all.data).toHaveLength(2);
      const paused = await json(await authed(stack, "/v1/models/demo-chat/offers?status=paused"));
      expect(paused.data.map((o: { status: string }) => o.status)).toEqual(["paused"]);
      const bad = await authed(stack, "/v1/models/demo-chat/offers?status=sleepy");
      expect(bad.status).toBe(400);
      expect((await json(bad)).error.code).toBe("invalid_request");
    });
  });

  describe("gRPC", () => {
    it("serves ListModels to a @grpc/grpc-js client", async () => {
      const client = grpcClient(stack.gateway.url);
      try {
        const response = await grpcUnary(
          client,
          CatalogService.method.listModels,
          {},
          {
            authorization: `Bearer ${stack.apiKey}`,
          },
        );
        expect(response.models.map((m) => m.id).sort()).toEqual(["demo-chat", "demo-coder"]);
        expect(response.models.every((m) => m.status === ModelStatus.ACTIVE)).toBe(true);
        const rest = await json(await authed(stack, "/v1/models"));
        expect(response.models.map((m) => m.modelId)).toEqual(
          rest.data.map((m: { model_id: string }) => m.model_id),
        );

        const error = await grpcUnary(
          client,
          CatalogService.method.getModel,
          { id: "nope" },
          {
            authorization: `Bearer ${stack.apiKey}`,
          },
        ).catch((e: grpc.ServiceError) => e);
        expect((error as grpc.ServiceError).code).toBe(grpc.status.NOT_FOUND);
        const unauthenticated = await grpcUnary(client, CatalogService.method.listModels, {}).catch(
          (e: grpc.ServiceError) => e,
        );
        expect((unauthenticated as grpc.ServiceError).code).toBe(grpc.status.UNAUTHENTICATED);
      } finally {
        client.close();
      }
    });

    it("answers buf curl over gRPC with the same models", async () => {
      const { stdout } = await run("node_modules/.bin/buf", [
        "curl",
        "--protocol",
        "grpc",
        "--http2-prior-knowledge",
        "--schema",
        "proto",
        "-H",
        `Authorization: Bearer ${stack.apiKey}`,
        `${stack.gateway.url}/gateway.v1.CatalogService/ListModels`,
      ]);
      const body = JSON.parse(stdout);
      expect(body.models.map((m: { id: string }) => m.id).sort()).toEqual([
        "demo-chat",
        "demo-coder",
      ]);
    });
    it("answers buf curl over Connect with one model, as docs/app-developers.md shows it", async () => {
      const { stdout } = await run("node_modules/.bin/buf", [
        "curl",
        "--protocol",
        "connect",
        "--schema",
        "proto",
        "-H",
        `Authorization: Bearer ${stack.apiKey}`,
        "-d",
        '{"id": "demo-chat"}',
        `${stack.gateway.url}/gateway.v1.CatalogService/GetModel`,
      ]);
      const body = JSON.parse(stdout);
      expect(body.model.id).toBe("demo-chat");
    });
  });

  describe("indexing", () => {
    it("shows an offer created on chain while running, then its pause, and never duplicates after a restart", async () => {
      const operator = stack.clients.wallet(stack.roles.operator.privateKey);
      const offerId = id32("offer:coder-new");
      const coder = stack.demo.models[1]!;
      const send = async (hash: `0x${string}`) =>
        stack.clients.publicClient.waitForTransactionReceipt({ hash });
      await send(
        await operator.writeContract({
          address: stack.demo.market,
          abi: marketAbi,
          functionName: "createOffer",
          args: [
            offerId,
            coder.modelId,
            stack.roles.operator.address,
            stack.roles.operator.address,
            demoTariff,
            demoMetadata("ap-south", "gpu-l4"),
          ],
        }),
      );
      const offersOf = async () =>
        (await json(await authed(stack, "/v1/models/demo-coder/offers"))).data as {
          offer_id: string;
          status: string;
          region: string;
        }[];
      await eventually(async () => (await offersOf()).some((o) => o.offer_id === offerId), 2000);
      expect((await offersOf()).find((o) => o.offer_id === offerId)).toMatchObject({
        status: "active",
        region: "ap-south",
      });

      await send(
        await operator.writeContract({
          address: stack.demo.market,
          abi: marketAbi,
          functionName: "setOfferStatus",
          args: [offerId, 1],
        }),
      );
      await eventually(
        async () => (await offersOf()).find((o) => o.offer_id === offerId)?.status === "paused",
        2000,
      );

      const count = async () => {
        const { rows } = await stack.database.db.pool.query<{ models: string; offers: string }>(
          "SELECT (SELECT count(*) FROM models) AS models, (SELECT count(*) FROM offers) AS offers",
        );
        return rows[0];
      };
      const before = await count();
      const cursorBefore = await stack.database.db.pool.query(
        "SELECT block_number FROM chain_cursors",
      );
      await stack.restart();
      const after = await count();
      expect(after).toEqual(before);
      expect(before).toEqual({ models: "2", offers: "4" });
      const cursorAfter = await stack.database.db.pool.query(
        "SELECT block_number FROM chain_cursors",
      );
      expect(cursorAfter.rows).toEqual(cursorBefore.rows);
      const listed = await offersOf();
      expect(listed.filter((o) => o.offer_id === offerId)).toHaveLength(1);
      expect(listed).toHaveLength(2);
    });
  });
});
