import { Type, type SchemaOptions, type TSchema } from "@sinclair/typebox";

/**
 * Shapes every body shares. A schema carrying `x-component` is one named shape: the OpenAPI
 * generator (src/rest/document.ts) hoists it to `components.schemas` under that name and refers to
 * it, so the document names it once however many bodies use it. `title` is how a validation
 * message names what was expected (src/schema/validate.ts).
 */

/** Every named shape, by name (the generator reads its canonical declaration here). */
export const componentSchemas = new Map<string, TSchema>();

/** Marks a schema as a named component of the OpenAPI document (one declaration per name). */
export function component<T extends TSchema>(name: string, schema: T): T {
  if (componentSchemas.has(name)) throw new Error(`schema component ${name} is declared twice`);
  const named = { ...schema, "x-component": name } as T;
  componentSchemas.set(name, named);
  return named;
}

export const Hex32 = component(
  "Hex32",
  Type.String({
    pattern: "^0x[0-9a-fA-F]{64}$",
    title: "Hex32 string (0x followed by 64 hex digits)",
  }),
);

export const Address = component(
  "Address",
  Type.String({
    pattern: "^0x[0-9a-fA-F]{40}$",
    title: "address (0x followed by 40 hex digits)",
  }),
);

export const Decimal = component(
  "Decimal",
  Type.String({
    pattern: "^(0|[1-9][0-9]*)$",
    title: "decimal string of a non-negative integer",
    description: "A non-negative integer as a decimal string (credit base units, tokens)",
  }),
);

export const UnixSeconds = component(
  "UnixSeconds",
  Type.Integer({ minimum: 0, title: "integer (Unix seconds)" }),
);

/** OpenAI's API marks optional fields nullable; this gateway reads `null` as absent. */
export function Nullable<T extends TSchema>(schema: T, options: SchemaOptions = {}) {
  return Type.Union([schema, Type.Null()], options);
}

/** An optional member that may also be `null` (read as absent). */
export function OptionalNullable<T extends TSchema>(schema: T, options: SchemaOptions = {}) {
  return Type.Optional(Nullable(schema, options));
}
