from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('groups', '0005_group_state_version'),
    ]

    operations = [
        migrations.AddField(
            model_name='group',
            name='rebalanced_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='group',
            name='rebalance_due_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),        migrations.AddField(
            model_name='group',
            name='rebalance_deferred_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
