import {
  create,
  ScalarType,
  type DescEnum,
  type DescField,
  type DescMessage,
} from "@bufbuild/protobuf";
import { FeatureSet_FieldPresence } from "@bufbuild/protobuf/wkt";
import { Type, type TObject, type TSchema } from "@sinclair/typebox";
import { Address, component, Decimal, Hex32, Nullable, UnixSeconds } from "../../schema/common.js";

/**
 * REST views derived from the protobuf messages they mirror: one declaration (the .proto) gives
 * both the view's JSON Schema (for the OpenAPI document) and the function that maps a message to
 * it, so a field added to a message reaches REST without being copied by hand.
 *
 * The mapping (the spec's JSON conventions): the proto field name is the JSON key (snake_case);
 * an enum is its value's name without the enum's prefix, in lower case (`OFFER_STATUS_ACTIVE` ->
 * `active`); an int64 named `*_at` is Unix seconds (a JSON integer), any other 64-bit integer a
 * decimal string; an optional field that is unset is `null`; `google.protobuf.Struct` is the
 * object as is; a nested message is its own view. Fields named alike mean alike across messages
 * ({@link fieldShapes}: every `offer_id` is a Hex32, every `payer` an address, every amount a
 * decimal string); a view states only its exceptions.
 */

/** How one field differs from the derived default. */
export interface FieldRule {
  /** The JSON Schema of the value (a refinement of the derived one: a pattern, an enum). */
  readonly schema?: TSchema;
  /** `""` (or an enum's unspecified value) is shown as `null`. */
  readonly emptyIsNull?: boolean;
  /** A 64-bit count shown as a JSON integer rather than a decimal string. */
  readonly integer?: boolean;
  readonly description?: string;
  /** Not shown in REST (a field only the gateway's own services read). */
  readonly omit?: boolean;
  /** A message field shown only when set (absent from the view, not null, when unset). */
  readonly optional?: boolean;
}

export interface ViewOptions {
  /** Constant members first in the view (`object: "model"`). */
  readonly constants?: Readonly<Record<string, string>>;
  readonly fields?: Readonly<Record<string, FieldRule>>;
  readonly description?: string;
  /** Views of nested messages, when they are named components of their own. */
  readonly nested?: Readonly<Record<string, ProtoView>>;
}

export interface ProtoView {
  readonly schema: TObject;
  /** The REST JSON of a message of this view's type. */
  readonly view: (message: object) => Record<string, unknown>;
}

const string = Type.String();
const digits = Type.String({ pattern: "^[0-9]+$" });

/** What a field name means wherever it occurs. */
const fieldShapes: Readonly<Record<string, TSchema>> = {
  request_id: Hex32,
  offer_id: Hex32,
  model_id: Hex32,
  permit_id: Hex32,
  pool_id: Hex32,
  quote_id: Hex32,
  batch_id: Hex32,
  tx_hash: Hex32,
  operator: Address,
  payout: Address,
  payer: Address,
  creator: Address,
  credit_token: Address,
  tariff_version: digits,
  version: digits,
  position_token_id: digits,
  input_price_per_mtok: Decimal,
  output_price_per_mtok: Decimal,
  wake_fee: Decimal,
  maximum_credits: Decimal,
  credits_charged: Decimal,
  credits: Decimal,
  settled_credits: Decimal,
  deposit: Decimal,
  settled: Decimal,
  charged_unsettled: Decimal,
  reserved: Decimal,
  available: Decimal,
  gas: Decimal,
  input_tokens: Decimal,
  output_tokens: Decimal,
  max_output_tokens: Decimal,
  total_cap: Decimal,
  per_request_cap: Decimal,
  period_cap: Decimal,
  warn_at: Decimal,
  period_used: Decimal,
  period_renews_at: UnixSeconds,
  credits_used: Decimal,
  credits_reserved: Decimal,
  last_used_at: UnixSeconds,
  issued_at: UnixSeconds,
  expires_at: UnixSeconds,
};

/** `OFFER_STATUS_ACTIVE` -> `active` (the value's name without the enum's prefix). */
export function enumWord(schema: DescEnum, value: number): string {
  return (schema.value[value]?.localName ?? "unspecified").toLowerCase();
}

/** The words of an enum's values, the unspecified (0) one left out. */
export function enumWords(schema: DescEnum): string[] {
  return schema.values.filter((v) => v.number !== 0).map((v) => enumWord(schema, v.number));
}

type Convert = (value: unknown) => unknown;

interface Plan {
  readonly key: string;
  readonly local: string;
  readonly convert: Convert;
}

const asIs: Convert = (value) => value;
const toSeconds: Convert = (value) => (value === undefined ? null : Number(value as bigint));
const toDecimal: Convert = (value) => (value as bigint).toString();
const toInteger: Convert = (value) => Number(value as bigint);

/** The view of messages of type `desc`; `name` makes it a named component of the document. */
export function protoView(
  desc: DescMessage,
  name: string | undefined,
  options: ViewOptions = {},
): ProtoView {
  const properties: Record<string, TSchema> = {};
  for (const [key, value] of Object.entries(options.constants ?? {}))
    properties[key] = Type.Literal(value);
  const plans: Plan[] = [];
  for (const field of desc.fields) {
    const rule = options.fields?.[field.name] ?? {};
    if (rule.omit === true) continue;
    const derived = derive(field, rule, options.nested?.[field.name]);
    const described =
      rule.description === undefined
        ? derived.schema
        : { ...derived.schema, description: rule.description };
    const optional = rule.optional === true;
    properties[field.name] = optional ? Type.Optional(described) : described;
    const convert: Convert = optional
      ? (value) => (value === undefined ? undefined : derived.convert(value))
      : derived.convert;
    plans.push({ key: field.name, local: field.localName, convert });
  }
  const object = Type.Object(
    properties,
    options.description === undefined ? {} : { description: options.description },
  );
  const constants = Object.entries(options.constants ?? {});
  return {
    schema: name === undefined ? object : component(name, object),
    view(message) {
      const out: Record<string, unknown> = {};
      for (const [key, value] of constants) out[key] = value;
      const source = message as Record<string, unknown>;
      for (const plan of plans) {
        const value = plan.convert(source[plan.local]);
        if (value !== undefined) out[plan.key] = value;
      }
      return out;
    },
  };
}

function derive(
  field: DescField,
  rule: FieldRule,
  nested: ProtoView | undefined,
): { schema: TSchema; convert: Convert } {
  const optional =
    field.presence === FeatureSet_FieldPresence.EXPLICIT && field.fieldKind === "scalar";
  const nullable = optional || rule.emptyIsNull === true;
  const base = (
    schema: TSchema,
    convert: Convert,
    refined = schema,
  ): { schema: TSchema; convert: Convert } => {
    const shaped = refined;
    if (!nullable) return { schema: shaped, convert };
    const empty = (value: unknown): boolean =>
      value === undefined || (rule.emptyIsNull === true && (value === "" || value === 0));
    return {
      schema: Nullable(shaped),
      convert: (value) => (empty(value) ? null : convert(value)),
    };
  };
  switch (field.fieldKind) {
    case "scalar": {
      const [schema, convert] = scalar(field.name, field.scalar, rule);
      return base(schema, convert, rule.schema ?? schema);
    }
    case "enum": {
      const schema = Type.Unsafe<string>({ enum: enumWords(field.enum) });
      return base(schema, (value) => enumWord(field.enum, value as number), rule.schema ?? schema);
    }
    case "message": {
      if (field.message.typeName === "google.protobuf.Struct")
        return base(Type.Object({}, { additionalProperties: true }), (value) => value ?? {});
      const view = nested ?? protoView(field.message, undefined);
      // An optional field is never shown empty: its empty view is not made.
      const empty = rule.optional === true ? undefined : view.view(create(field.message));
      return base(view.schema, (value) =>
        value === undefined ? empty : view.view(value as object),
      );
    }
    case "list": {
      if (field.listKind === "message") {
        const view = nested ?? protoView(field.message, undefined);
        return base(Type.Array(view.schema), (value) =>
          (value as object[]).map((item) => view.view(item)),
        );
      }
      if (field.listKind === "enum") {
        const schema = field.enum;
        return base(Type.Array(Type.Unsafe<string>({ enum: enumWords(schema) })), (value) =>
          (value as number[]).map((v) => enumWord(schema, v)),
        );
      }
      const [item, convert] = scalar(field.name, field.scalar, {});
      return base(Type.Array(rule.schema ?? item), (value) => (value as unknown[]).map(convert));
    }
    default:
      throw new Error(`protoView: ${field.name} is a map, which no REST view has`);
  }
}

function scalar(name: string, type: ScalarType, rule: FieldRule): [TSchema, Convert] {
  switch (type) {
    case ScalarType.STRING:
      return [fieldShapes[name] ?? string, asIs];
    case ScalarType.BOOL:
      return [Type.Boolean(), asIs];
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return [Type.Integer({ minimum: 0 }), asIs];
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return [Type.Integer(), asIs];
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      if (name.endsWith("_at")) return [UnixSeconds, toSeconds];
      if (rule.integer === true) return [Type.Integer({ minimum: 0 }), toInteger];
      return [Decimal, toDecimal];
    default:
      throw new Error(`protoView: ${name} has a scalar type no REST view has`);
  }
}
