import { Ajv2020 } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { openApiDocument } from "../src/rest/routes/index.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { openPermit } from "./helpers/market.js";
import { mutatedValue, validValue, type Schema } from "./helpers/schema-arbitrary.js";
import { startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * The generated OpenAPI document against the gateway, in the direction a hand-kept document
 * drifts: a body the document rejects, the gateway rejects. fast-check makes valid bodies from
 * each route's request schema and mutates one place of them (a member replaced by another JSON
 * value, or removed, or the whole body); Ajv keeps the mutations the published document rejects;
 * each is sent to a real gateway with valid credentials and must be refused with a 4xx the
 * document lists for that route and status, before any provider is called.
 *
 * And the other way for the bodies the facade validates itself: a body the document accepts is
 * never refused as malformed (400 `invalid_request` / `invalid_json`).
 */

const doc = openApiDocument() as Schema;
const ajv = new Ajv2020({ strict: false, allErrors: false });
// ajv-formats is CommonJS: its default export arrives wrapped under some loaders.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ??
  addFormatsModule) as (ajv: Ajv2020) => void;
addFormats(ajv);
ajv.addSchema(doc, "openapi.json");

interface BodyRoute {
  readonly method: string;
  readonly path: string;
  readonly schemaPointer: string;
  readonly operation: Schema;
}

/** Every documented operation that takes a JSON body. */
function bodyRoutes(): BodyRoute[] {
  const out: BodyRoute[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Schema>)) {
    for (const [method, op] of Object.entries(item)) {
      const operation = op as Schema;
      if (operation.requestBody === undefined) continue;
      const escaped = path.replaceAll("~", "~0").replaceAll("/", "~1");
      out.push({
        method: method.toUpperCase(),
        path,
        schemaPointer: `/paths/${escaped}/${method}/requestBody/content/application~1json/schema`,
        operation,
      });
    }
  }
  return out;
}

/** The error code of an answer, in the spec's or a dialect's shape. */
function codeOf(body: unknown): string | undefined {
  const error = (body as { error?: { code?: unknown } } | null)?.error;
  return typeof error?.code === "string" ? error.code : undefined;
}

/** The codes the document lists for `status` on an operation (from its `code` const or enum). */
function documentedCodes(operation: Schema, status: number): string[] {
  const response = (operation.responses as Record<string, Schema>)[String(status)];
  const schema = (response?.content as Record<string, Schema> | undefined)?.["application/json"]
    ?.schema as Schema | undefined;
  const code = (
    (schema?.properties as Schema | undefined)?.error as { properties?: Schema } | undefined
  )?.properties?.code as { const?: string; enum?: string[] } | undefined;
  return code?.enum ?? (code?.const === undefined ? [] : [code.const]);
}

describe("the generated OpenAPI document and the gateway agree on request bodies", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  let permit: string;

  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
    permit = await openPermit(stack, { deposit: 10n ** 18n });
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  async function send(route: BodyRoute, body: unknown) {
    // A path's id is one the route could name: an offer of the demo market, an authorization.
    const id = route.path.startsWith("/v1/provider-offers/{id}")
      ? stack.demo.offers[0]!.offerId
      : "pauth_000000000000000000000000";
    const url = `${stack.gateway.url}${route.path.replace("{id}", id).replace("{payer}", stack.roles.payer.address)}`;
    const headers: Record<string, string> = {
      "content-type": "application/json",
      authorization: `Bearer ${route.path.startsWith("/settlements") ? stack.operatorToken : stack.apiKey}`,
      "x-gateway-permit": permit,
    };
    const res = await fetch(url, { method: route.method, headers, body: JSON.stringify(body) });
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    return { status: res.status, body: parsed, text };
  }

  const routes = bodyRoutes();

  it("documents a body for every route that reads one", () => {
    expect(routes.map((r) => `${r.method} ${r.path}`).sort()).toEqual([
      "POST /settlements/flush",
      "POST /v1/chat/completions",
      "POST /v1/messages",
      "POST /v1/payers/{payer}/authorizations",
      "POST /v1/payers/{payer}/authorizations/revoke",
      "POST /v1/permit-authorizations",
      "POST /v1/permit-authorizations/challenge",
      "POST /v1/permit-authorizations/{id}/revoke",
      "POST /v1/provider-offers/challenge",
      "POST /v1/provider-offers/register",
      "POST /v1/provider-offers/{id}/key-bindings",
      "POST /v1/provider-offers/{id}/key-bindings/challenge",
      "POST /v1/quotes",
      "POST /v1/responses",
    ]);
  });

  for (const route of routes) {
    it(`${route.method} ${route.path}: a body the document rejects is refused before any provider call`, async () => {
      const validate = ajv.getSchema(`openapi.json#${route.schemaPointer}`);
      if (validate === undefined) throw new Error(`no schema at ${route.schemaPointer}`);
      const schema = { $ref: `#${route.schemaPointer}` };
      let refused = 0;
      await fc.assert(
        fc.asyncProperty(mutatedValue(doc, schema), async (mutation) => {
          fc.pre(!validate(mutation.body));
          const upstreamBefore = fake.requests.length;
          const answer = await send(route, mutation.body);
          const label = `${mutation.what}: ${JSON.stringify(mutation.body).slice(0, 300)} -> ${answer.status} ${answer.text.slice(0, 300)}`;
          expect(answer.status, label).toBeGreaterThanOrEqual(400);
          expect(answer.status, label).toBeLessThan(500);
          expect(documentedCodes(route.operation, answer.status), label).toContain(
            codeOf(answer.body),
          );
          expect(fake.requests.length, label).toBe(upstreamBefore);
          refused += 1;
        }),
        { numRuns: 60, seed: Number(process.env.PROPERTY_SEED ?? Date.now() % 2 ** 31) },
      );
      // Enough of the runs were real rejections for the property to mean something.
      expect(refused).toBeGreaterThanOrEqual(30);
    }, 120_000);
  }

  // Times the services refuse for being past (or too far ahead) are not the document's to say.
  const now = Math.floor(Date.now() / 1000);
  const soon = fc.integer({ min: now + 120, max: now + 600 });
  const justIssued = fc.integer({ min: now - 60, max: now });
  const past = fc.integer({ min: 1, max: now });
  for (const route of routes.filter((r) => !/chat|quotes|responses|messages/.test(r.path))) {
    it(`${route.method} ${route.path}: a body the document accepts is not refused as malformed`, async () => {
      const schema = { $ref: `#${route.schemaPointer}` };
      await fc.assert(
        fc.asyncProperty(
          validValue(doc, schema, { expiresAt: soon, issuedAt: justIssued, before: past }),
          async (body) => {
            const answer = await send(route, body);
            const label = `${JSON.stringify(body).slice(0, 300)} -> ${answer.status} ${answer.text.slice(0, 300)}`;
            expect(["invalid_request", "invalid_json"], label).not.toContain(codeOf(answer.body));
          },
        ),
        { numRuns: 30, seed: Number(process.env.PROPERTY_SEED ?? Date.now() % 2 ** 31) },
      );
    }, 120_000);
  }
});
