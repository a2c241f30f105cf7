"""Where a user of an installed distlock is sent: the ``pip install`` line of an extra, and the documentation site.

A message that tells a user what to do must work for someone who installed a wheel and has no checkout: it names
the extra's install line (:func:`install_line`) and links to the documentation site (:func:`docs_url`, built from
:data:`DOCS_SITE`, the one place the site's address is written in the code; pyproject.toml's ``[project.urls]`` and
mkdocs.yml's ``site_url`` give the same address, which tests/tooling/test_docs.py checks). The integrations
(``distlock_django``, ``distlock_sqla``, ``distlock.celery``) start with :func:`require_extra`, so that importing one
without its framework says which extra to install instead of a bare ``ModuleNotFoundError``.

What can go wrong: :func:`require_extra` raises ``ModuleNotFoundError`` (an ``ImportError``, as a missing package
always does) naming the extra; :func:`docs_url` checks nothing at run time — tests/tooling/test_docs.py checks that
every page and heading the code links to exists.
"""

from __future__ import annotations

import importlib

__all__ = ["DISTRIBUTION", "DOCS_SITE", "docs_url", "install_line", "require_extra"]

#: The name distlock is installed by (the import packages are ``distlock``, ``distlock_django``, ``distlock_sqla``).
DISTRIBUTION = "distlock-fenced"
#: The documentation site: docs/ built by mkdocs (mkdocs.yml), one page per Markdown file, at its directory URL.
DOCS_SITE = "https://distlock.readthedocs.io/en/latest/"


def install_line(extra: str) -> str:
    """The command that installs distlock with ``extra``: ``pip install 'distlock-fenced[django]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def docs_url(page: str) -> str:
    """The site's address of ``page``, a path under docs/ with an optional heading id.

    ``docs_url("reference/django-settings.md#keys")`` is ``https://…/reference/django-settings/#keys``.
    """
    path, hash_mark, anchor = page.partition("#")
    path = path.removesuffix(".md")
    path = "" if path == "index" else path.removesuffix("/index") + "/"
    return f"{DOCS_SITE}{path}{hash_mark}{anchor}"


def require_extra(module: str, *, extra: str, integration: str) -> None:
    """Import ``module`` (the framework ``integration`` is built on), or raise ``ModuleNotFoundError`` saying that
    ``integration`` needs the ``extra`` and how to install it."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"{integration} needs the '{extra}' extra: {install_line(extra)} ({e})", name=e.name
        ) from e
