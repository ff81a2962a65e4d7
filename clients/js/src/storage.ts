// Where the line keeps what outlives the app: the ticket, the entry token, the order.

/** The shape both `window.localStorage` (synchronous) and React Native's AsyncStorage (promises) have. */
export interface TicketStorage {
  getItem(key: string): string | null | Promise<string | null>;
  setItem(key: string, value: string): void | Promise<void>;
  removeItem(key: string): void | Promise<void>;
}

/** A storage that lives as long as the process: for Node, tests, or an app that wants no resume. */
export function memoryStorage(): TicketStorage {
  const items = new Map<string, string>();
  return {
    getItem: (key) => items.get(key) ?? null,
    setItem: (key, value) => void items.set(key, value),
    removeItem: (key) => void items.delete(key),
  };
}

/** What the line keeps per user and target. */
export interface Saved {
  ticket?: string;
  entryToken?: string;
  expiresAt?: string | null;
  direct?: boolean;
  order?: { status: number; body: unknown };
}

/** One JSON record under one key; a storage that refuses (private mode, quota) only costs the resume. */
export class Kept {
  constructor(
    private readonly storage: TicketStorage,
    private readonly key: string,
  ) {}

  async read(): Promise<Saved> {
    try {
      const text = await this.storage.getItem(this.key);
      const value: unknown = text ? JSON.parse(text) : null;
      return value && typeof value === "object" ? (value as Saved) : {};
    } catch {
      return {};
    }
  }

  async write(value: Saved): Promise<void> {
    try {
      await this.storage.setItem(this.key, JSON.stringify(value));
    } catch {
      // not kept: the line goes on, and only a restart forgets it
    }
  }

  async change(changes: Partial<Saved>): Promise<Saved> {
    const value = { ...(await this.read()), ...changes };
    await this.write(value);
    return value;
  }

  async clear(): Promise<void> {
    try {
      await this.storage.removeItem(this.key);
    } catch {
      // see write
    }
  }
}
