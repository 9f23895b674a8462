import type { Static, TSchema } from "@sinclair/typebox";
import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";

/**
 * Compiles a body's schema (declared once with TypeBox, src/schema/*.ts) to an Ajv validator
 * whose refusal carries the spec's error code and a message naming the field: `'messages[0].role'
 * must be one of system, developer, ...`. The same declaration is the TypeScript type
 * (`Static<T>`) and the OpenAPI document's schema (src/rest/document.ts), so the three cannot
 * drift. It imports nothing above src/schema: the domain turns a refusal into its 400 (a
 * GatewayError) once, at its boundary (src/domain/body-check.ts).
 *
 * What a schema cannot say (a key that occurs twice, an integer beyond 2^53 read exactly, the
 * bounds checked on the bytes before parsing) stays in code beside the schema.
 *
 * Annotation keywords of this gateway: `x-component` (the OpenAPI component name of a shared
 * shape), `x-error-code` (the error code a value that fails this schema gets, instead of
 * `invalid_request`; e.g. `invalid_hex`) and `x-error-message` (what the message says after the
 * field's name when a value fails this schema, or, on a `discriminator`, when the tag matches no
 * branch: a refusal that says why, e.g. `'store' must be false or left out: ...`).
 *
 * A union discriminated by a tag member (`oneOf` with OpenAPI's `discriminator`, see
 * src/schema/dialect-shapes.ts) is checked against the one branch its tag names, so a message
 * speaks of that branch (`'input[2].call_id' is required`), or of the tag when no branch has it.
 */

const ajv = new Ajv2020({
  allErrors: false,
  verbose: true,
  strict: true,
  // TypeBox's Integer is `type: "integer"`; nothing is coerced, defaulted or removed.
  coerceTypes: false,
  useDefaults: false,
  removeAdditional: false,
  discriminator: true,
});
// ajv-formats is CommonJS: its default export arrives wrapped under some loaders.
const addFormats = ((addFormatsModule as unknown as { default?: unknown }).default ??
  addFormatsModule) as (ajv: Ajv2020, formats: string[]) => void;
addFormats(ajv, ["uri"]);
ajv.addKeyword({ keyword: "x-component", schemaType: "string" });
ajv.addKeyword({ keyword: "x-error-code", schemaType: "string" });
ajv.addKeyword({ keyword: "x-error-message", schemaType: "string" });

type Schema = { readonly [keyword: string]: unknown };

/**
 * Why a value fails its schema: the error code (`invalid_request`, or the schema's
 * `x-error-code`, e.g. `invalid_hex`: one of the domain's error codes) and a message naming the
 * field.
 */
export interface SchemaRefusal {
  readonly code: string;
  readonly message: string;
}

/** A value checked against its schema: the value, typed, or why it is refused. */
export type SchemaResult<T> =
  { readonly ok: true; readonly value: T } | ({ readonly ok: false } & SchemaRefusal);

/** A compiled schema (see {@link compileSchema}). */
export type SchemaCheck<T extends TSchema> = (
  value: unknown,
  at?: string,
) => SchemaResult<Static<T>>;

/**
 * Compiles `schema`; the returned function returns its argument typed as the schema's static
 * type, or the {@link SchemaRefusal} (`invalid_request`, or the schema's `x-error-code`). `at`
 * names the value in messages when it is not a whole request body (`'provider.order[0]'`).
 */
export function compileSchema<T extends TSchema>(schema: T): SchemaCheck<T> {
  // Compiled at its first use, not when the module that declares it is loaded: a process loads
  // some sixty body schemas and uses few of them (a test, a CLI command), and compiling them
  // all was 0.4 s of every start (issue 36: `npm test`'s import time). One check per call after.
  let validate: ValidateFunction | undefined;
  return (value, at) => {
    validate ??= ajv.compile(schema);
    if (validate(value)) return { ok: true, value: value as Static<T> };
    return { ok: false, ...refusal(validate.errors ?? [], at) };
  };
}

/** Whether `value` matches `schema` (for tests and the property test's oracle). */
export function matches(schema: TSchema, value: unknown): boolean {
  return ajv.validate(schema, value);
}

function refusal(errors: readonly ErrorObject[], at: string | undefined): SchemaRefusal {
  const error = reported(errors);
  if (error === undefined) return { code: "invalid_request", message: "the body is not valid" };
  const path = pathOf(error);
  const field = fieldName(path, at);
  const code = errorCode(error) ?? "invalid_request";
  const said = errorMessage(error);
  return { code, message: refusalMessage(error, field, said) };
}

function refusalMessage(error: ErrorObject, field: string, said: string | undefined): string {
  switch (error.keyword) {
    case "required":
      return `'${field}' is required`;
    case "additionalProperties":
      return `'${field}' is not a member this body may have`;
    case "maxProperties":
      return `'${field}' has more than ${String(error.params.limit)} members`;
    case "discriminator":
      return `'${field}' ${said ?? `must be ${oneOf(tagValues(error))}`}`;
    default: {
      if (said !== undefined) return `'${field}' ${said}`;
      const subject = field === "" ? "the request body" : `'${field}'`;
      return `${subject} must be ${describe(error.parentSchema)}`;
    }
  }
}

/** The path an error is about: a missing, extra or tag member's own path, not its object's. */
function pathOf(error: ErrorObject): string {
  const params = error.params as { missingProperty?: string; additionalProperty?: string };
  const tag = error.keyword === "discriminator" ? (error.params as { tag: string }).tag : undefined;
  const member = params.missingProperty ?? params.additionalProperty ?? tag;
  return member === undefined ? error.instancePath : `${error.instancePath}/${escape(member)}`;
}

function escape(key: string): string {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

/**
 * The error to report: the deepest (a union's failing branch says more than "must be an object
 * or null"); among those at one depth the last, which for a union is the union itself ("a
 * string or an array of strings" rather than one branch's "a string").
 */
function reported(errors: readonly ErrorObject[]): ErrorObject | undefined {
  let best: ErrorObject | undefined;
  let bestDepth = -1;
  for (const error of errors) {
    const depth = pathOf(error).split("/").length;
    if (depth >= bestDepth) {
      best = error;
      bestDepth = depth;
    }
  }
  return best;
}

/** `/messages/0/role` -> `messages[0].role`, under `at` when given. */
function fieldName(pointer: string, at: string | undefined): string {
  let name = at ?? "";
  for (const raw of pointer.split("/").slice(1)) {
    const key = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (/^(0|[1-9][0-9]*)$/.test(key)) name += `[${key}]`;
    else name += name === "" ? key.slice(0, 100) : `.${key.slice(0, 100)}`;
  }
  return name;
}

function errorCode(error: ErrorObject): string | undefined {
  const schema = error.parentSchema as Schema | undefined;
  const own = schema?.["x-error-code"];
  if (typeof own === "string") return own;
  for (const branch of (schema?.anyOf ?? schema?.oneOf ?? []) as Schema[]) {
    const code = branch["x-error-code"];
    if (typeof code === "string") return code;
  }
  return undefined;
}

/** The schema's own `x-error-message` (a discriminator's, when the tag matched no branch). */
function errorMessage(error: ErrorObject): string | undefined {
  const schema = (error.keyword === "discriminator" ? error.schema : error.parentSchema) as
    Schema | undefined;
  const said = schema?.["x-error-message"];
  return typeof said === "string" ? said : undefined;
}

/** The tag values a discriminated union serves: its branches', less those that refuse (`not`). */
function tagValues(error: ErrorObject): string[] {
  const tag = (error.params as { tag: string }).tag;
  const branches = ((error.parentSchema as Schema | undefined)?.oneOf ?? []) as Schema[];
  return branches.flatMap((branch) => {
    const value = (branch.properties as Record<string, Schema> | undefined)?.[tag];
    if (value === undefined || "not" in value) return [];
    return ("const" in value ? [value.const] : ((value.enum ?? []) as unknown[])).map(String);
  });
}

const oneOf = (values: readonly string[]): string =>
  values.length === 1 ? JSON.stringify(values[0]) : `one of ${values.join(", ")}`;

const article = (text: string): string => (/^[aeiou]/i.test(text) ? `an ${text}` : `a ${text}`);

/** What a schema expects, in words: "an integer from 1 to 128", "one of price, latency". */
export function describe(schema: unknown): string {
  if (typeof schema !== "object" || schema === null) return "a JSON value";
  const s = schema as Schema;
  if (typeof s.title === "string") return article(s.title);
  const branches = (s.anyOf ?? s.oneOf) as Schema[] | undefined;
  if (branches !== undefined) {
    if (branches.every((b) => "const" in b))
      return `one of ${branches.map((b) => String(b.const)).join(", ")}`;
    const named = branches.filter((b) => b.type !== "null").map(describe);
    return [...new Set(named)].join(" or ");
  }
  if ("const" in s) return JSON.stringify(s.const);
  if (Array.isArray(s.enum)) return `one of ${s.enum.map(String).join(", ")}`;
  switch (s.type) {
    case "string": {
      const min = s.minLength as number | undefined;
      const max = s.maxLength as number | undefined;
      const base = min !== undefined && min > 0 ? "a non-empty string" : "a string";
      return max === undefined ? base : `${base} of at most ${max} characters`;
    }
    case "integer":
    case "number": {
      const word = s.type === "integer" ? "an integer" : "a number";
      const min = s.minimum as number | undefined;
      const max = s.maximum as number | undefined;
      if (min !== undefined && max !== undefined) return `${word} from ${min} to ${max}`;
      if (min !== undefined) return `${word} of at least ${min}`;
      if (max !== undefined) return `${word} of at most ${max}`;
      return word;
    }
    case "boolean":
      return "a boolean";
    case "array": {
      const min = s.minItems as number | undefined;
      const max = s.maxItems as number | undefined;
      let text = "an array";
      if (min !== undefined && min > 0 && max !== undefined) text += ` of ${min} to ${max} items`;
      else if (min !== undefined && min > 0)
        text += ` of at least ${min} item${min === 1 ? "" : "s"}`;
      else if (max !== undefined) text += ` of at most ${max} items`;
      return s.items === undefined ? text : `${text}, each ${describe(s.items)}`;
    }
    case "object":
      return "an object";
    case "null":
      return "null";
    default:
      return "a JSON value";
  }
}
