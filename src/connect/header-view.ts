/** Request headers as Node has them: lower-case names, repeated headers as arrays. */
export type HeaderRecord = Readonly<Record<string, string | string[] | undefined>>;

/**
 * Node's request headers as a WHATWG `Headers`, read in place: copying them into a `Headers`
 * costs more than everything else the REST facade does before a service method runs. A write
 * first copies them, so the request's own are never changed.
 */
export class HeaderView implements Headers {
  private copy: Headers | undefined;

  constructor(private readonly source: HeaderRecord) {}

  private own(): Headers {
    if (this.copy === undefined) {
      this.copy = new Headers();
      for (const [name, value] of Object.entries(this.source)) {
        if (name.startsWith(":")) continue; // HTTP/2 pseudo-headers are not headers
        if (typeof value === "string") this.copy.append(name, value);
        else if (Array.isArray(value)) for (const v of value) this.copy.append(name, v);
      }
    }
    return this.copy;
  }

  get(name: string): string | null {
    if (this.copy !== undefined) return this.copy.get(name);
    const value = this.source[name.toLowerCase()];
    if (value === undefined) return null;
    return typeof value === "string" ? value : value.join(", ");
  }

  has(name: string): boolean {
    return this.get(name) !== null;
  }

  getSetCookie(): string[] {
    return this.own().getSetCookie();
  }

  set(name: string, value: string): void {
    this.own().set(name, value);
  }

  append(name: string, value: string): void {
    this.own().append(name, value);
  }

  delete(name: string): void {
    this.own().delete(name);
  }

  forEach(
    callback: (value: string, key: string, parent: Headers) => void,
    thisArg?: unknown,
  ): void {
    this.own().forEach((value, key) => callback.call(thisArg, value, key, this));
  }

  entries(): ReturnType<Headers["entries"]> {
    return this.own().entries();
  }

  keys(): ReturnType<Headers["keys"]> {
    return this.own().keys();
  }

  values(): ReturnType<Headers["values"]> {
    return this.own().values();
  }

  [Symbol.iterator](): ReturnType<Headers["entries"]> {
    return this.own().entries();
  }
}
