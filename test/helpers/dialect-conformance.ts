import type { TSchema } from "@sinclair/typebox";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import { describe, expect, it } from "vitest";
import type { Dialect, DialectEvent } from "../../src/domain/dialects/types.js";

/**
 * Whether what a dialect's translator emits is what its schemas (src/rest/views/responses.ts,
 * src/rest/views/messages.ts) say, read as the OpenAPI document's conformance test reads them
 * (test/openapi.test.ts): an object schema that does not say `additionalProperties` is closed, so
 * a member the translator emits and the schema does not list fails; unions are plain `oneOf`
 * (exactly one branch matches), as a client without OpenAPI's `discriminator` reads them.
 */

type Schema = Record<string, unknown>;

/** A copy of `schema` with every object that lists members and says nothing else closed. */
function closed(schema: TSchema): Schema {
  const copy = JSON.parse(JSON.stringify(schema)) as Schema;
  const close = (node: unknown): void => {
    if (Array.isArray(node)) node.forEach(close);
    else if (typeof node === "object" && node !== null) {
      const n = node as Schema;
      if (typeof n.properties === "object" && !("additionalProperties" in n)) {
        n.additionalProperties = false;
      }
      for (const value of Object.values(n)) close(value);
    }
  };
  close(copy);
  return copy;
}

const ajv = new Ajv2020({ strict: false, allErrors: true });
const validators = new Map<TSchema, ValidateFunction>();

/** Fails the test, with Ajv's errors and the value, unless `value` matches the closed `schema`. */
export function expectConforms(schema: TSchema, value: unknown, label: string): void {
  let validate = validators.get(schema);
  if (validate === undefined) {
    validate = ajv.compile(closed(schema));
    validators.set(schema, validate);
  }
  expect(
    validate(value),
    `${label}: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(value).slice(0, 800)}`,
  ).toBe(true);
}

/** What a dialect accepted (request bodies) and emitted (JSON answers, stream events). */
export interface Emitted {
  readonly requests: unknown[];
  readonly answers: unknown[];
  readonly events: DialectEvent[];
}

/** `dialect`, keeping every body it accepts and every answer and event it emits in `emitted`. */
export function recording(dialect: Dialect, emitted: Emitted): Dialect {
  const keep = (events: DialectEvent[]): DialectEvent[] => {
    emitted.events.push(...events);
    return events;
  };
  return {
    ...dialect,
    toCanonical(body) {
      const canonical = dialect.toCanonical(body);
      emitted.requests.push(body);
      return canonical;
    },
    fromCompletion(completion, charge) {
      const answer = dialect.fromCompletion(completion, charge);
      emitted.answers.push(answer);
      return answer;
    },
    createStream(ctx) {
      const stream = dialect.createStream(ctx);
      return {
        chunk: (chunk) => keep(stream.chunk(chunk)),
        finish: (charge) => keep(stream.finish(charge)),
        fail: (error) => keep(stream.fail(error)),
      };
    },
  };
}

/**
 * The test that every body `emitted` holds matches `request` (what the translator accepts, the
 * document accepts), every answer `answer`, and every event's data `event`, named (SSE `event:`)
 * by its `type`. Registered last in a test file: the tests before it fill `emitted`.
 */
export function testEmittedConforms(
  emitted: Emitted,
  schemas: { readonly request: TSchema; readonly answer: TSchema; readonly event: TSchema },
): void {
  describe("what the tests above accepted and emitted matches the schemas (closed, as the document's test reads them)", () => {
    it("request bodies, JSON answers, and stream events named by their type", () => {
      // Run alone, this test would check nothing.
      for (const [kind, list] of Object.entries(emitted)) {
        expect(list.length, `no ${kind} recorded: run the whole file`).toBeGreaterThan(0);
      }
      emitted.requests.forEach((body, i) => expectConforms(schemas.request, body, `request ${i}`));
      emitted.answers.forEach((answer, i) => expectConforms(schemas.answer, answer, `answer ${i}`));
      emitted.events.forEach((event, i) => {
        expect(event.event).toBe((event.data as { type?: unknown }).type);
        expectConforms(schemas.event, event.data, `event ${i} (${String(event.event)})`);
      });
    });
  });
}
