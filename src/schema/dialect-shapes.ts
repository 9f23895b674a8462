import {
  Type,
  type ObjectOptions,
  type SchemaOptions,
  type Static,
  type TObject,
  type TProperties,
  type TSchema,
  type TUnion,
  type TUnsafe,
} from "@sinclair/typebox";
import { ChatRequest } from "./chat.js";
import { component } from "./common.js";

/**
 * Shapes and schema builders the client dialects' bodies share (src/schema/responses.ts,
 * src/schema/messages.ts; DESIGN.md section 9).
 *
 * Both APIs tag their items (`{"type": "function_call", ...}`, `{"role": "user", ...}`), so a
 * union of items is `oneOf` with OpenAPI's `discriminator` ({@link Tagged}): the validator checks
 * an item against the one branch its tag names, and a message speaks of that branch (`'input[2].
 * call_id' is required`) or of the tag (`'input[2].type' must be one of message, ...`), where a
 * plain union could only say that the item matches none of its branches. A branch whose tag is
 * {@link Refused} exists to refuse that tag with a message that says why.
 *
 * Request objects say which members are read; a member they do not list is ignored ({@link Open})
 * unless the object says otherwise (the bodies themselves refuse unknown members). Answer objects
 * list every member the gateway emits and stay closed.
 */

/** The tag member's schema: one value (`const`) or several (`enum`); a discriminator reads either. */
export function Tag<const V extends readonly [string, ...string[]]>(
  values: V,
  options: SchemaOptions = {},
): TUnsafe<V[number]> {
  return Type.Unsafe<V[number]>(
    values.length === 1
      ? { type: "string", const: values[0], ...options }
      : { type: "string", enum: [...values], ...options },
  );
}

/**
 * A branch for a tag the API knows and this gateway refuses: it never matches, and a value with
 * this tag gets `message` after the tag's name (`'input[0].type' "item_reference" is not
 * supported: ...`). Refused tags are left out of "must be one of ..." messages, and out of the
 * union's TypeScript type.
 */
export function Refused<const V extends readonly [string, ...string[]]>(
  tag: string,
  values: V,
  message: string,
): TUnsafe<never> {
  return Type.Unsafe<never>(
    Open({ [tag]: Type.Unsafe({ ...Tag(values), not: {}, "x-error-message": message }) }),
  );
}

/** A request object whose members other than `properties` are accepted and ignored. */
export function Open<T extends TProperties>(properties: T, options: ObjectOptions = {}) {
  return Type.Object(properties, { additionalProperties: true, ...options });
}

/** Each branch's type with the union's own members (TypeScript narrows a union of these by tag). */
type WithMembers<U, M extends TProperties> = [keyof M] extends [never]
  ? U
  : U extends unknown
    ? U & Static<TObject<M>>
    : never;

/**
 * A union of objects told apart by their `tag` member (each branch declares it with {@link Tag},
 * or is {@link Refused}): `oneOf` with OpenAPI's `discriminator`. `members` are declared on the union
 * itself (a tag of an enclosing union, `type: "message"` on role-tagged messages). `unknown` is
 * what a tag no branch has gets after the field's name (default: "must be one of ...").
 */
export function Tagged<T extends TSchema[], M extends TProperties = Record<never, never>>(
  tag: string,
  branches: [...T],
  options: SchemaOptions & { readonly unknown?: string; readonly members?: M } = {},
): TUnsafe<WithMembers<Static<TUnion<T>>, M>> {
  const { unknown, members, ...rest } = options;
  return Type.Unsafe({
    type: "object",
    properties: { [tag]: Type.String(), ...members },
    required: [tag],
    // The branches say which members they have; the union only finds the branch.
    additionalProperties: true,
    oneOf: branches,
    discriminator: {
      propertyName: tag,
      ...(unknown === undefined ? {} : { "x-error-message": unknown }),
    },
    ...rest,
  });
}

/**
 * {@link Tagged}, where the tag may be left out (or null) for one kind of object, `untagged`:
 * Responses' input messages (`{"role": "user", "content": "Hi"}`), Messages' client tools.
 */
export function OptionallyTagged<T extends TSchema, U extends TSchema>(
  tag: string,
  tagged: T,
  untagged: U,
  options: SchemaOptions = {},
): TUnsafe<Static<T> | Static<U>> {
  return Type.Unsafe({
    type: "object",
    if: {
      properties: { [tag]: { not: { type: "null" } } },
      required: [tag],
      additionalProperties: true,
    },
    then: tagged,
    else: untagged,
    ...options,
  });
}

/** A member that must be absent or null: present, it gets `message` after its name. */
export function Absent(message: string, description: string) {
  return Type.Optional(Type.Null({ "x-error-message": message, description }));
}

/** A token limit: a positive integer JavaScript reads exactly. */
export const TokenLimit = Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER });

/** A token count of an answer. */
export const TokenCount = Type.Integer({ minimum: 0 });

/** A non-empty string (a name, an id). */
export const Name = Type.String({ minLength: 1 });

/** A JSON schema the gateway passes on to the provider as it came (tool parameters, output format). */
export const JsonSchemaObject = component(
  "JsonSchemaObject",
  Type.Object(
    {},
    {
      additionalProperties: true,
      title: "JSON schema object",
      description: "A JSON schema, passed on to the provider as it came",
    },
  ),
);

/** An array the gateway always answers empty (`annotations`, `logprobs`). */
export const EmptyArray = Type.Array(Type.Unknown(), { maxItems: 0 });

/**
 * The gateway's own members, as on the chat route (one declaration: ChatRequest's), passed on to
 * the canonical request.
 */
export const gatewayMembers = {
  offer: ChatRequest.properties.offer,
  provider: ChatRequest.properties.provider,
};
