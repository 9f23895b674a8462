/**
 * The gateway's REST API as the console calls it: same origin, the API key from session storage
 * as a bearer token, never in a URL, never in local storage.
 */

const storageKey = "market-console.api-key";

/** An error answer of the gateway: its `{error: {code, type, message}}` and HTTP status. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   */
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

/**
 * @param {Storage} storage where the key is kept for this tab (sessionStorage)
 */
export function createApi(storage) {
  return {
    hasKey() {
      return (storage.getItem(storageKey) ?? "") !== "";
    },
    /** @param {string} key */
    setKey(key) {
      storage.setItem(storageKey, key);
    },
    forgetKey() {
      storage.removeItem(storageKey);
    },
    /**
     * GET `path` (a path of this gateway, parameters already encoded) as JSON.
     * @param {string} path
     * @param {{ signal?: AbortSignal }} [options]
     */
    async get(path, options = {}) {
      const key = storage.getItem(storageKey);
      if (key === null || key === "")
        throw new ApiError(401, "missing_api_key", "Enter an API key first.");
      const res = await fetch(path, {
        headers: { authorization: `Bearer ${key}`, accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        signal: options.signal,
      });
      const text = await res.text();
      let body;
      try {
        body = JSON.parse(text);
      } catch {
        throw new ApiError(res.status, "not_json", `HTTP ${res.status}: the answer is not JSON`);
      }
      if (!res.ok) {
        const error = body?.error ?? {};
        throw new ApiError(
          res.status,
          String(error.code ?? "error"),
          String(error.message ?? `HTTP ${res.status}`),
        );
      }
      return body;
    },
  };
}

/** @typedef {ReturnType<typeof createApi>} Api */

/** A path segment from user input (ids are hex, but nothing typed may change the path). */
export function segment(value) {
  return encodeURIComponent(value.trim());
}
