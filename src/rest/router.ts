import { GatewayError } from "../domain/errors.js";
import type { Route } from "./route-kit.js";

/**
 * Finds the route of a request target in a route table: fixed paths by a map, `{id}`
 * templates by their patterns, in the table's order.
 */

export type RouteMatch = { route: Route; params: string[] } | "method_not_allowed" | undefined;

export interface Router {
  find(method: string | undefined, pathname: string): RouteMatch;
}

function decodePathParam(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new GatewayError("invalid_request", "malformed percent-encoding in the path");
  }
}

/** A route's path template as a pattern whose groups are its parameters. */
function patternOf(template: string): RegExp {
  const source = template.replaceAll(/\{[^}]+\}/g, "([^/]+)");
  return new RegExp(`^${source}$`);
}

export function createRouter(routes: readonly Route[]): Router {
  /** Routes with a fixed path, by path; the others are tried in order by their patterns. */
  const fixedRoutes = new Map<string, Route[]>();
  const patternRoutes: { route: Route; pattern: RegExp }[] = [];
  for (const route of routes) {
    if (!route.path.includes("{")) {
      const list = fixedRoutes.get(route.path) ?? [];
      list.push(route);
      fixedRoutes.set(route.path, list);
    } else patternRoutes.push({ route, pattern: patternOf(route.path) });
  }

  return {
    find(method, pathname) {
      let pathKnown = false;
      const fixed = fixedRoutes.get(pathname);
      if (fixed !== undefined) {
        pathKnown = true;
        for (const route of fixed) if (route.method === method) return { route, params: [] };
      }
      for (const { route, pattern } of patternRoutes) {
        const m = pattern.exec(pathname);
        if (m === null) continue;
        pathKnown = true;
        if (route.method === method) return { route, params: m.slice(1).map(decodePathParam) };
      }
      return pathKnown ? "method_not_allowed" : undefined;
    },
  };
}

// A request target whose path WHATWG URL parsing leaves as it is: no query or fragment, no
// backslash, no leading "//", only characters a path keeps unencoded, and no dot segment.
const plainTarget = /^\/(?!\/)[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*$/;
const dotSegment = /(?:^|\/)(?:\.|%2e){1,2}(?:\/|$)/i;

/** The path and query of a request target, as `new URL(target, base)` reads them. */
export function targetOf(target: string): { pathname: string; query: string } {
  // The common target needs no parse (a URL costs about a microsecond).
  if (plainTarget.test(target) && !dotSegment.test(target)) return { pathname: target, query: "" };
  const url = new URL(target, "http://gateway.invalid");
  return { pathname: url.pathname, query: url.search.slice(1) };
}
