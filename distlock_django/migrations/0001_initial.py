"""``DistributedLock``: no table (unmanaged); Django creates its content type and the force-release permission."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = ()

    operations = (
        migrations.CreateModel(
            name="DistributedLock",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "distributed lock",
                "verbose_name_plural": "distributed locks",
                "permissions": (("force_release_lock", "Can force-release a distributed lock"),),
                "managed": False,
                "default_permissions": (),
            },
        ),
    )
