import type { Static, TSchema } from "@sinclair/typebox";
import { compileSchema } from "../schema/validate.js";
import { GatewayError, type ErrorCode } from "./errors.js";

/**
 * The domain's boundary with the body schemas (src/schema): a schema's refusal becomes the
 * spec's 400, a {@link GatewayError} with the refusal's code and message, here and nowhere else.
 */

/** A validator: the value, typed, or a thrown 400 (GatewayError) naming the field. */
export type BodyCheck<T extends TSchema> = (value: unknown, at?: string) => Static<T>;

/**
 * Compiles `schema` (src/schema/validate.ts); the returned function returns its argument typed as
 * the schema's static type, or throws {@link GatewayError} (`invalid_request`, or the schema's
 * `x-error-code`). `at` names the value in messages when it is not a whole request body
 * (`'provider.order[0]'`).
 */
export function compileBody<T extends TSchema>(schema: T): BodyCheck<T> {
  const check = compileSchema(schema);
  return (value, at) => {
    const result = check(value, at);
    if (result.ok) return result.value;
    // A schema's x-error-code is one of the domain's codes (invalid_hex).
    throw new GatewayError(result.code as ErrorCode, result.message);
  };
}
