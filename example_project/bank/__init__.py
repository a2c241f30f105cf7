"""The example bank app: fenced accounts, per-account locks in views, a singleton report task."""
