// The browser's storage, as the console keeps things in it: the tab's (sessionStorage: the token, the
// draft, the messages kept for a reload) and the browser's (localStorage: the theme, the browser's id).
// Every use goes through here. A browser may deny the page its storage altogether (Chrome with all
// cookies blocked: reading `window.sessionStorage` itself throws a SecurityError), or the storage may be
// full: then a read finds nothing (null), a write keeps nothing (false), a removal does nothing, and the
// page goes on without it (the token then lives for the page only: a reload asks for it again).

function store(name) {
  const area = () => window[name];
  return {
    /** The value kept under `key`, or null (none, or the storage cannot be reached). */
    get(key) {
      try {
        return area().getItem(key);
      } catch {
        return null;
      }
    },
    /** Keeps `value` under `key`; false if it could not be kept (storage denied or full). */
    set(key, value) {
      try {
        area().setItem(key, value);
        return true;
      } catch {
        return false;
      }
    },
    /** Forgets `key` (nothing to forget where the storage cannot be reached). */
    remove(key) {
      try {
        area().removeItem(key);
      } catch { /* storage denied: nothing was kept */ }
    },
  };
}

/** The tab's storage (sessionStorage): gone with the tab, kept through a reload. */
export const sessionStore = store("sessionStorage");
/** The browser's storage (localStorage): shared by its tabs, kept across visits. */
export const localStore = store("localStorage");
