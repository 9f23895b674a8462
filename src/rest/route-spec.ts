import type { TSchema } from "@sinclair/typebox";
import type { ErrorCode } from "../domain/errors.js";

/**
 * What a route declares for the OpenAPI document (src/rest/document.ts generates it): its
 * path, parameters, body and answer schemas and its own error codes, in OpenAPI's shapes.
 */

export type JsonSchema = { readonly [keyword: string]: unknown };

export interface Ref {
  readonly $ref: string;
}

export interface Parameter {
  readonly name: string;
  readonly in: "path" | "query" | "header";
  readonly required: boolean;
  readonly description?: string;
  readonly schema: JsonSchema | TSchema;
}

export interface Header {
  readonly description?: string;
  readonly required?: boolean;
  readonly schema: JsonSchema | TSchema;
}

export interface MediaType {
  readonly schema: JsonSchema | TSchema;
  /** For `text/event-stream`: the schema of each event's `data` (an extension). */
  readonly "x-sse-data"?: JsonSchema | TSchema;
}

export interface Response {
  readonly description: string;
  readonly headers?: Record<string, Header | Ref>;
  readonly content?: Record<string, MediaType>;
}

/** Error codes a route answers, by HTTP status. */
export type Codes = Readonly<Partial<Record<number, readonly ErrorCode[]>>>;

/** What the document says of one route (the facade's route table carries it, with the handler). */
export interface RouteSpec {
  readonly method: "GET" | "POST" | "DELETE";
  /** The path template: `/v1/models/{id}`. */
  readonly path: string;
  readonly operationId: string;
  readonly summary: string;
  readonly description?: string;
  readonly tag:
    "operations" | "catalog" | "inference" | "permits" | "provider" | "settlement" | "audits";
  /**
   * Who may call: an API key (default), the settlement operator's token, either of them
   * (`apiKeyOrOperator`), or anyone.
   */
  readonly auth?: "apiKey" | "operator" | "apiKeyOrOperator" | "apiKeyOrPayer" | "none";
  /** `{id}`'s description and shape, for a path with one. */
  readonly pathId?: { readonly description: string; readonly schema?: TSchema };
  /** Path parameters after `{id}` (`/v1/provider-offers/{id}/key-bindings/{bindingId}`). */
  readonly pathParams?: readonly Parameter[];
  /** Query and header parameters besides X-Request-Id (which every route takes). */
  readonly parameters?: readonly (Parameter | Ref)[];
  /** The JSON request body: its schema, and whether it may be left out. */
  readonly body?: { readonly schema: TSchema; readonly optional?: boolean };
  /** The success answer: a JSON body (`schema`) or a full response. */
  readonly answer: { readonly description: string; readonly schema: TSchema } | Response;
  /** Other answers than errors (the readiness 503). */
  readonly otherAnswers?: Readonly<Record<number, Response>>;
  /**
   * The route's own error codes. The codes every route shares are added from what the route
   * is: any route (500, 503 shutting_down), an API-keyed one, one with a body, one with `{id}`.
   */
  readonly errors?: Codes;
  /** Leave the shared codes out (routes outside the API: /metrics). */
  readonly onlyOwnErrors?: boolean;
  /** A dialect route's error body (DESIGN.md section 9), carrying the gateway's code. */
  readonly errorSchema?: TSchema;
}
