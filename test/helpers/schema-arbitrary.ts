import fc from "fast-check";

/**
 * fast-check arbitraries made from the JSON Schemas of the generated OpenAPI document: values a
 * schema accepts (for the keywords this gateway's schemas use), and mutations of them that may
 * break it. The property test keeps only the mutations the document really rejects (checked
 * with Ajv), so a mutation that happens to stay valid is discarded, never misjudged.
 */

export type Schema = { readonly [keyword: string]: unknown };

/** Resolves `#/components/...` references against the document. */
export function resolve(root: Schema, schema: Schema): Schema {
  let node = schema;
  while (typeof node.$ref === "string") {
    const target = node.$ref
      .slice(2)
      .split("/")
      .reduce<unknown>(
        (at, key) => (at as Record<string, unknown>)[key.replaceAll("~1", "/")],
        root,
      );
    const { $ref: _ref, ...siblings } = node;
    node = { ...(target as Schema), ...siblings };
  }
  return node;
}

const anyJson = fc.jsonValue({ maxDepth: 2 });
const safe = Number.MAX_SAFE_INTEGER;

/** Arbitraries for members by name, where the schema's range holds values the time refuses. */
export type Overrides = Readonly<Record<string, fc.Arbitrary<unknown>>>;

/**
 * Values `schema` accepts (bounded in size: at most 3 items per array); a member named in
 * `overrides` takes its values from there (an `expiresAt` in the near future).
 */
export function validValue(
  root: Schema,
  schema: Schema,
  overrides: Overrides = {},
): fc.Arbitrary<unknown> {
  const s = resolve(root, schema);
  if ("const" in s) return fc.constant(s.const);
  if (Array.isArray(s.enum)) return fc.constantFrom(...(s.enum as unknown[]));
  const branches = (s.anyOf ?? s.oneOf) as Schema[] | undefined;
  if (branches !== undefined)
    return fc.oneof(...branches.map((b) => validValue(root, b, overrides)));
  switch (s.type) {
    case "string": {
      if (typeof s.pattern === "string") return fc.stringMatching(new RegExp(s.pattern));
      // URLs on IP literals: a host name would make the gateway ask DNS.
      if (s.format === "uri")
        return fc
          .tuple(fc.constantFrom("http", "https"), fc.ipV4(), fc.nat(65535), fc.webPath())
          .map(([scheme, host, port, path]) => `${scheme}://${host}:${port}${path}`);
      const minLength = (s.minLength as number | undefined) ?? 0;
      const maxLength = Math.min((s.maxLength as number | undefined) ?? minLength + 12, 64);
      return fc.string({ minLength, maxLength });
    }
    case "integer":
      return fc.integer({
        min: Math.max((s.minimum as number | undefined) ?? -1_000_000, -safe),
        max: Math.min((s.maximum as number | undefined) ?? 1_000_000, safe),
      });
    case "number":
      return fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e6, max: 1e6 });
    case "boolean":
      return fc.boolean();
    case "null":
      return fc.constant(null);
    case "array": {
      const minLength = (s.minItems as number | undefined) ?? 0;
      const maxLength = Math.min((s.maxItems as number | undefined) ?? 3, minLength + 3);
      const items =
        s.items === undefined ? anyJson : validValue(root, s.items as Schema, overrides);
      return fc.array(items, { minLength, maxLength });
    }
    case "object": {
      const properties = (s.properties ?? {}) as Record<string, Schema>;
      const required = (s.required ?? []) as string[];
      const model: Record<string, fc.Arbitrary<unknown>> = {};
      for (const [key, member] of Object.entries(properties))
        model[key] = overrides[key] ?? validValue(root, member, overrides);
      return fc.record(model, { requiredKeys: required });
    }
    default:
      return anyJson;
  }
}

/** Values of every JSON type, for replacing a member with one its schema may not allow. */
const replacements: readonly unknown[] = [
  null,
  true,
  0,
  -1,
  1.5,
  129,
  2 ** 64,
  "",
  "x",
  "0x12",
  [],
  [1],
  {},
  { a: 1 },
];

export interface Mutation {
  readonly body: unknown;
  readonly what: string;
}

/** Every place of `value` (the root, each member, each item) as a path of keys. */
function places(value: unknown, path: (string | number)[] = []): (string | number)[][] {
  const out: (string | number)[][] = [path];
  if (Array.isArray(value)) value.forEach((v, i) => out.push(...places(v, [...path, i])));
  else if (typeof value === "object" && value !== null)
    for (const [key, v] of Object.entries(value)) out.push(...places(v, [...path, key]));
  return out;
}

function edit(
  value: unknown,
  path: readonly (string | number)[],
  to: unknown | typeof remove,
): unknown {
  if (path.length === 0) return to;
  const [head, ...rest] = path as [string | number, ...(string | number)[]];
  if (Array.isArray(value)) {
    const copy = [...value];
    if (rest.length === 0 && to === remove) copy.splice(head as number, 1);
    else copy[head as number] = edit(copy[head as number], rest, to);
    return copy;
  }
  const copy = { ...(value as Record<string, unknown>) };
  if (rest.length === 0 && to === remove) delete copy[head];
  else copy[head] = edit(copy[head], rest, to);
  return copy;
}

const remove = Symbol("remove");

/** A valid value of `schema` with one place replaced by another JSON value, or removed. */
export function mutatedValue(root: Schema, schema: Schema): fc.Arbitrary<Mutation> {
  return fc
    .tuple(validValue(root, schema), fc.nat(), fc.constantFrom(...replacements, remove))
    .map(([valid, pick, to]) => {
      const all = places(valid);
      const path = all[pick % all.length] ?? [];
      if (to === remove && path.length === 0) return { body: valid, what: "unchanged" };
      const body = edit(valid, path, to);
      const at = path.length === 0 ? "the body" : path.join(".");
      return {
        body,
        what: to === remove ? `removed ${at}` : `${at} := ${JSON.stringify(to)}`,
      };
    });
}
